"""The graph GLoader trains on: CSR topology by destination, node features and labels.

A node's neighbours for sampling are the sources of its in-edges (PyG's and DGL's convention:
messages flow ``src -> dst``), so the CSR is indexed by destination: ``indices[indptr[v]:indptr[v+1]]``
are the sources of the edges into ``v``.

On disk a graph is a directory: ``graph.json`` (format name, version, and each array's file, dtype
and shape) plus one raw little-endian file per array. :meth:`Graph.load` maps the files with
``np.memmap``: nothing is read until it is touched, the features may be far larger than memory, and
forked workers share the same pages without a copy. A pickled file-backed graph carries only its
path (a spawned worker re-maps the files), never the arrays.

:meth:`Graph.load` also reads a ``.pt`` file saved from a PyG ``Data`` object (or a dict with
``edge_index``, ``x``, ``y``), with ``torch.load(weights_only=True)`` so the file cannot run code.
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Graph", "GraphFormatError", "FORMAT", "VERSION"]

FORMAT = "coordl-graph"
VERSION = 1
HEADER = "graph.json"
_ARRAYS = ("indptr", "indices", "out_degree", "features", "labels", "train_idx")
_OPTIONAL = ("labels", "train_idx")


class GraphFormatError(ValueError):
    """A graph file is missing, truncated or not what its header says. ``path`` names the file."""

    def __init__(self, message: str, path: str | os.PathLike) -> None:
        super().__init__(f"{os.fspath(path)}: {message}")
        self.path = os.fspath(path)


def _csr_by_dst(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(dst, kind="stable")
    counts = np.bincount(dst, minlength=num_nodes)
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    index_dtype = np.int32 if num_nodes < 2**31 else np.int64
    return indptr, src[order].astype(index_dtype, copy=False)


def _as_numpy(a: Any, what: str) -> np.ndarray:
    if hasattr(a, "detach"):  # a torch tensor
        a = a.detach().cpu().numpy()
    arr = np.asarray(a)
    if arr.ndim == 0:
        raise ValueError(f"{what} must be an array, got a scalar")
    return arr


class Graph:
    """CSR topology (by destination), node features, labels, out-degrees.

    Build one with :meth:`from_edges`, :meth:`from_pyg` or :meth:`load`; not by hand.

    Attributes:
        indptr: int64 ``[num_nodes + 1]``; ``indices[indptr[v]:indptr[v+1]]`` are ``v``'s neighbours.
        indices: int32 (int64 for huge graphs) ``[num_edges]``, source ids.
        out_degree: int64 ``[num_nodes]``: how many nodes list each node as a neighbour. A node's
            chance of being sampled grows with it, so the feature cache keeps the highest first.
        features: ``[num_nodes, ...]`` (float32 usually); labels: ``[num_nodes, ...]`` or None.
        train_idx: int64 training node ids when the source ships a split (synth, a PyG
            ``train_mask``), else None.
        path: the directory the arrays are mapped from, or None for an in-memory graph.
    """

    def __init__(
        self,
        indptr: np.ndarray,
        indices: np.ndarray,
        out_degree: np.ndarray,
        features: np.ndarray,
        labels: np.ndarray | None,
        train_idx: np.ndarray | None = None,
        path: str | None = None,
    ) -> None:
        self.indptr, self.indices, self.out_degree = indptr, indices, out_degree
        self.features, self.labels, self.train_idx, self.path = features, labels, train_idx, path

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_edges(
        cls, src: Any, dst: Any, features: Any, labels: Any, num_nodes: int | None = None
    ) -> Graph:
        """A graph from directed edges ``src -> dst`` (arrays or tensors of node ids).

        Args:
            src, dst: edge endpoints, equal length; ``v``'s neighbours are the ``src`` of edges into ``v``.
            features: ``[num_nodes, ...]`` node features.
            labels: ``[num_nodes, ...]`` node labels, or None.
            num_nodes: default ``len(features)``.
        """
        src_a = _as_numpy(src, "src").astype(np.int64, copy=False).ravel()
        dst_a = _as_numpy(dst, "dst").astype(np.int64, copy=False).ravel()
        feats = _as_numpy(features, "features")
        n = int(num_nodes if num_nodes is not None else feats.shape[0])
        if src_a.shape != dst_a.shape:
            raise ValueError(f"src and dst differ in length: {src_a.size} vs {dst_a.size}")
        if feats.shape[0] != n:
            raise ValueError(f"features has {feats.shape[0]} rows, num_nodes is {n}")
        lab = None if labels is None else _as_numpy(labels, "labels")
        if lab is not None and lab.shape[0] != n:
            raise ValueError(f"labels has {lab.shape[0]} rows, num_nodes is {n}")
        for name, ids in (("src", src_a), ("dst", dst_a)):
            if ids.size and (ids.min() < 0 or ids.max() >= n):
                raise ValueError(f"{name} has node ids outside [0, {n})")
        indptr, indices = _csr_by_dst(src_a, dst_a, n)
        out_degree = np.bincount(src_a, minlength=n).astype(np.int64)
        return cls(indptr, indices, out_degree, feats, lab)

    @classmethod
    def from_pyg(cls, data: Any) -> Graph:
        """A graph from a PyG ``Data`` (or any object or dict with ``edge_index``, ``x``, ``y``)."""
        get = data.get if isinstance(data, dict) else (lambda k, d=None: getattr(data, k, d))
        edge_index, x = get("edge_index"), get("x")
        if edge_index is None or x is None:
            raise ValueError("a PyG graph needs edge_index and x")
        ei = _as_numpy(edge_index, "edge_index")
        if ei.ndim != 2 or ei.shape[0] != 2:
            raise ValueError(f"edge_index must have shape [2, E], got {list(ei.shape)}")
        num_nodes = get("num_nodes", None)
        graph = cls.from_edges(ei[0], ei[1], x, get("y", None), num_nodes=num_nodes)
        mask = get("train_mask", None)
        if mask is not None:
            graph.train_idx = np.flatnonzero(_as_numpy(mask, "train_mask")).astype(np.int64)
        return graph

    # -- shape --------------------------------------------------------------------------------

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.shape[0] - 1)

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    @property
    def feature_row_bytes(self) -> int:
        """Bytes of one node's features (what the cache budget is divided by)."""
        return int(self.features.dtype.itemsize * int(np.prod(self.features.shape[1:], dtype=np.int64)))

    def in_degree(self) -> np.ndarray:
        """Neighbours available to each node for sampling."""
        return np.diff(self.indptr)

    def __repr__(self) -> str:
        where = f", path={self.path!r}" if self.path else ""
        return (
            f"Graph(num_nodes={self.num_nodes}, num_edges={self.num_edges}, "
            f"features={tuple(self.features.shape)} {self.features.dtype}{where})"
        )

    # -- files --------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Write the graph as a directory of raw arrays plus ``graph.json`` (written last, atomically,
        so a half-written directory is never loaded as a graph)."""
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        (root / HEADER).unlink(missing_ok=True)
        header: dict[str, Any] = {"format": FORMAT, "version": VERSION, "num_nodes": self.num_nodes}
        header["num_edges"] = self.num_edges
        for name in _ARRAYS:
            arr = getattr(self, name)
            if arr is None:
                continue
            dtype = arr.dtype.newbyteorder("<")
            target = root / f"{name}.bin"
            if not _is_mapped_from(arr, target):
                write_chunked(target, arr if arr.dtype == dtype else np.asarray(arr).astype(dtype))
            header[name] = {"file": f"{name}.bin", "dtype": dtype.str, "shape": list(arr.shape)}
        tmp = root / f".{HEADER}.tmp"
        tmp.write_text(json.dumps(header, indent=1))
        os.replace(tmp, root / HEADER)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Graph:
        """Map a saved graph directory (or read a ``.pt`` file saved from a PyG ``Data``)."""
        p = Path(path)
        if p.is_file() and p.suffix in (".pt", ".pth"):
            return cls.from_pyg(_torch_load(p))
        if not p.exists():
            raise GraphFormatError("no such graph directory or .pt file", p)
        header_path = p / HEADER
        if not header_path.is_file():
            raise GraphFormatError(f"not a graph directory (no {HEADER})", header_path)
        try:
            header = json.loads(header_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise GraphFormatError(f"header is not valid JSON ({e})", header_path) from None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise GraphFormatError(f"not a {FORMAT} header", header_path)
        if header.get("version") != VERSION:
            raise GraphFormatError(
                f"version {header.get('version')!r}, this coordl reads {VERSION}", header_path
            )
        # (an optional array absent from the files is None)
        arrays: dict[str, Any] = {
            name: _map(p, header, name, required=name not in _OPTIONAL) for name in _ARRAYS
        }
        graph = cls(**arrays, path=str(p.resolve()))
        _check_consistent(graph, header_path)
        return graph

    def __getstate__(self) -> dict:
        if self.path is not None:  # workers re-map the files: no copy of the arrays travels
            return {"path": self.path}
        return dict(self.__dict__)

    def __setstate__(self, state: dict) -> None:
        if set(state) == {"path"}:
            self.__dict__.update(Graph.load(state["path"]).__dict__)
        else:
            self.__dict__.update(state)


def _is_mapped_from(arr: np.ndarray, target: Path) -> bool:
    # Re-saving a memmap into its own file would truncate what it reads from: it is already there.
    filename = getattr(arr, "filename", None)
    return filename is not None and target.exists() and os.path.samefile(filename, target)


def write_chunked(path: Path, arr: np.ndarray, chunk_bytes: int = 64 << 20) -> None:
    """Write ``arr``'s raw bytes in chunks (a memmap source is never read into memory whole)."""
    rows_per_chunk = max(1, chunk_bytes // max(1, arr.itemsize * int(np.prod(arr.shape[1:], dtype=np.int64))))
    with open(path, "wb") as f:
        for start in range(0, max(arr.shape[0], 1), rows_per_chunk):
            f.write(np.ascontiguousarray(arr[start : start + rows_per_chunk]).tobytes())


def _map(root: Path, header: dict, name: str, *, required: bool) -> np.ndarray | None:
    spec = header.get(name)
    header_path = root / HEADER
    if spec is None:
        if required:
            raise GraphFormatError(f"header has no entry for {name!r}", header_path)
        return None
    try:
        file = root / str(spec["file"])
        dtype = np.dtype(spec["dtype"])
        shape = tuple(int(s) for s in spec["shape"])
    except (KeyError, TypeError, ValueError) as e:
        raise GraphFormatError(f"bad entry for {name!r}: {e}", header_path) from None
    if not file.is_file():
        raise GraphFormatError(f"missing ({name} of the graph in {root})", file)
    expected = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    actual = file.stat().st_size
    if actual != expected:
        what = "truncated" if actual < expected else "longer than its header says"
        raise GraphFormatError(
            f"{what}: expected {expected} bytes for {name} {list(shape)}, found {actual}", file
        )
    if expected == 0:
        return np.zeros(shape, dtype=dtype)
    arr = np.memmap(file, dtype=dtype, mode="r", shape=shape)
    if name == "features":
        _advise_random(arr)
    return arr


def _advise_random(arr: np.memmap) -> None:
    # Gathers read scattered rows: the kernel's default read-around (128 KiB per page fault) would
    # read many times the bytes asked for from a slow disk and flush the page cache with them.
    mapping = getattr(arr, "_mmap", None)
    if mapping is not None and hasattr(mapping, "madvise") and hasattr(mmap, "MADV_RANDOM"):
        mapping.madvise(mmap.MADV_RANDOM)


def _check_consistent(g: Graph, header_path: Path) -> None:
    n, e = g.num_nodes, g.num_edges
    if g.indptr[0] != 0 or int(g.indptr[-1]) != e:
        raise GraphFormatError(f"indptr must run from 0 to num_edges={e}", header_path)
    for name in ("out_degree", "features", "labels"):
        arr = getattr(g, name)
        if arr is not None and arr.shape[0] != n:
            raise GraphFormatError(f"{name} has {arr.shape[0]} rows, the graph has {n} nodes", header_path)
    if g.train_idx is not None and g.train_idx.size and (g.train_idx.min() < 0 or g.train_idx.max() >= n):
        raise GraphFormatError(f"train_idx has node ids outside [0, {n})", header_path)


def _pyg_safe_globals() -> list:
    """PyG's own container classes, allowed through ``weights_only`` loading: they hold tensors and
    plain attributes, and allowing them (not arbitrary globals) is what lets ``torch.save(data)``
    files load without running code from the file."""
    try:
        from torch_geometric.data.data import Data, DataEdgeAttr, DataTensorAttr
        from torch_geometric.data.storage import EdgeStorage, GlobalStorage, NodeStorage
    except ImportError:
        return []
    return [Data, DataEdgeAttr, DataTensorAttr, GlobalStorage, NodeStorage, EdgeStorage]


def _torch_load(path: Path) -> Any:
    import torch

    try:
        with torch.serialization.safe_globals(_pyg_safe_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises several unrelated types for a bad file
        hint = "" if _pyg_safe_globals() else " (a PyG Data object needs torch_geometric installed)"
        raise GraphFormatError(
            f"cannot read as a PyG graph with weights_only=True{hint}: {type(e).__name__}: {str(e)[:160]}; "
            "a dict {'edge_index': ..., 'x': ..., 'y': ...} (data.to_dict()) always loads",
            path,
        ) from None

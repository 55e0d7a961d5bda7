"""Datasets that implement the fetch/prep split, and the adapter for datasets that do not.

- :class:`ImageFolder`: the standard ``root/class/xxx.jpg`` layout, local or staged from a remote
  source (``nfs://`` URL or ``stage_dir=``) through ``nfs_cache.StagedSource``.
- :class:`FileListDataset`: the same over an explicit list of files.
- :func:`as_item_source`: what ``coordl.DataLoader`` calls on whatever the user passes. A source that
  already has ``fetch``/``prep`` is returned as is; a torchvision-style dataset (``.samples``,
  ``.loader``, ``.transform``) is split automatically; any other map-style dataset runs as one
  opaque stage (``opaque = True``, with a warning: only whole-sample caching can apply).

``prep`` returns ``(sample, target)`` like torchvision; ``fetch`` returns the file's bytes and counts
nothing (the loader counts bytes and hits). When the transform is a :class:`coordl.transforms.Compose`
with a deterministic prefix (decode, resize), the dataset also exposes ``prep_deterministic``,
``prep_random``, ``prep_identity`` and ``dataset_identity`` so that prefix can be cached as an array.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from coordl.errors import CorruptItemError
from coordl.source import is_item_source
from coordl.transforms import Compose, Decode, decode_image

__all__ = ["ImageFolder", "FileListDataset", "TorchvisionStyleSource", "OpaqueSource", "as_item_source"]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class _FileSource:
    """Shared fetch/prep logic over a list of (relative name, target) items."""

    def __init__(self, transform: Callable | None, target_transform: Callable | None) -> None:
        self.transform = transform if transform is not None else Compose([Decode()])
        self.target_transform = target_transform
        self._det: Compose | None = None
        self._rand: Compose | None = None
        if isinstance(self.transform, Compose):
            det, rand = self.transform.split()
            if len(det):
                self._det, self._rand = det, rand

    # fetch() opens, reads and closes a file (or a staged copy, under nfs_cache's flock locks): safe
    # to call from several threads, so coordl.DataLoader reads ahead of prep by default.
    thread_safe_fetch = True

    # Subclasses provide these.
    items: list[tuple[str, Any]]

    def _read(self, index: int) -> bytes:
        raise NotImplementedError

    def describe(self, index: int) -> str:
        """The item's file path (used in error messages)."""
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.items)

    def fetch(self, index: int) -> bytes:
        """The stored bytes of item ``index`` (no decoding, nothing counted)."""
        return self._read(index)

    def _target(self, index: int) -> Any:
        target = self.items[index][1]
        return self.target_transform(target) if self.target_transform is not None else target

    def _wrap_corrupt(self, e: CorruptItemError, index: int) -> CorruptItemError:
        path = self.describe(index)
        return CorruptItemError(f"{path}: {e}", path=path, index=index)

    def prep(self, raw: bytes, index: int) -> Any:
        """``(transform(raw), target)``; undecodable bytes raise CorruptItemError naming the file."""
        try:
            sample = self.transform(raw)
        except CorruptItemError as e:
            raise self._wrap_corrupt(e, index) from e
        return sample, self._target(index)

    def __getitem__(self, index: int) -> Any:
        """Plain map-style access (fetch + prep), so the dataset also works with torch's DataLoader."""
        return self.prep(self.fetch(index), index)

    # The split is exposed only when the transform has one: has_split_prep() must say False
    # otherwise, so these are properties that raise AttributeError (getattr(..., None) -> None).
    def _need_split(self, name: str) -> None:
        if self._det is None:
            raise AttributeError(f"{name}: transform {self.transform!r} has no deterministic prefix to cache")

    @property
    def prep_deterministic(self) -> Callable[[bytes, int], np.ndarray]:
        """``(raw, i) -> array``: the cacheable part of prep (decode, resize)."""
        self._need_split("prep_deterministic")
        return self._prep_deterministic

    @property
    def prep_random(self) -> Callable[[np.ndarray, int], Any]:
        """``(array, i) -> (sample, target)``: the part of prep that must run every epoch."""
        self._need_split("prep_random")
        return self._prep_random

    @property
    def prep_identity(self) -> Callable[[], str]:
        """``() -> str``: the repr of the deterministic prefix (every parameter included)."""
        self._need_split("prep_identity")
        return self._prep_identity

    def _prep_deterministic(self, raw: bytes, index: int) -> np.ndarray:
        try:
            return np.ascontiguousarray(self._det(raw))
        except CorruptItemError as e:
            raise self._wrap_corrupt(e, index) from e

    def _prep_random(self, array: np.ndarray, index: int) -> Any:
        return self._rand(array), self._target(index)

    def _prep_identity(self) -> str:
        return repr(self._det)

    def _list_digest(self) -> str:
        h = hashlib.sha256()
        for name, target in self.items:
            h.update(f"{name}\t{target}\n".encode())
        return h.hexdigest()[:16]


class FileListDataset(_FileSource):
    """Items are explicit files; ``targets[i]`` is item i's label (None: prep returns the sample only).

    ``transform`` gets the raw bytes (default: decode to an HWC uint8 array).
    """

    def __init__(
        self,
        paths: Sequence[str | os.PathLike],
        targets: Sequence[Any] | None = None,
        transform: Callable | None = None,
        target_transform: Callable | None = None,
    ) -> None:
        super().__init__(transform, target_transform)
        if targets is not None and len(targets) != len(paths):
            raise ValueError(f"FileListDataset: {len(paths)} paths but {len(targets)} targets")
        self.paths = [os.fspath(p) for p in paths]
        self.has_targets = targets is not None
        self.items = list(
            zip(self.paths, targets if targets is not None else [None] * len(self.paths), strict=True)
        )

    def _read(self, index: int) -> bytes:
        with open(self.paths[index], "rb") as f:
            return f.read()

    def describe(self, index: int) -> str:
        return self.paths[index]

    def prep(self, raw: bytes, index: int) -> Any:
        sample, target = super().prep(raw, index)
        return (sample, target) if self.has_targets else sample

    def _prep_random(self, array: np.ndarray, index: int) -> Any:
        sample, target = super()._prep_random(array, index)
        return (sample, target) if self.has_targets else sample

    def dataset_identity(self) -> str:
        """Digest of the file list (paths and targets)."""
        return f"filelist:{self._list_digest()}"


def _is_url(root: str) -> bool:
    return "://" in root


class ImageFolder(_FileSource):
    """``root/<class>/<...>/<file>`` images; classes are the sorted sub-directory names.

    ``transform`` gets the raw bytes (default: decode to an HWC uint8 array; use
    ``coordl.transforms.train_transform()``). When ``root`` is an ``nfs://`` URL or ``stage_dir`` is
    given, files are listed and read through ``nfs_cache.StagedSource`` (first read stages each file
    onto local disk within ``stage_budget_bytes``; ``prefetch=True`` stages ahead in the background),
    and :meth:`stats` reports the staging counters.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        transform: Callable | None = None,
        target_transform: Callable | None = None,
        *,
        extensions: Sequence[str] = IMG_EXTENSIONS,
        stage_dir: str | os.PathLike | None = None,
        stage_budget_bytes: int | None = None,
        prefetch: bool = False,
    ) -> None:
        super().__init__(transform, target_transform)
        self.root = os.fspath(root)
        self.extensions = tuple(e.lower() for e in extensions)
        self._staged = None
        if stage_dir is not None or _is_url(self.root):
            from nfs_cache import StagedSource  # lazy: only staged datasets need it

            if stage_dir is None:
                raise ValueError(
                    f"ImageFolder({self.root!r}): a URL root needs stage_dir= (a local directory)"
                )
            from coordl.counters import SharedCounters

            # Workers read remote bytes too: count them where the loader's stats() can sum them.
            self._staged = StagedSource(
                self.root,
                os.fspath(stage_dir),
                budget_bytes=stage_budget_bytes,
                prefetch=prefetch,
                counters=SharedCounters(["remote_bytes_read"]),
            )
            # The agreed interface lists relative paths; accept records with .relpath too.
            relpaths = [f if isinstance(f, str) else f.relpath for f in self._staged.list_files()]
        else:
            relpaths = self._scan_local()
        relpaths = [p for p in relpaths if "/" in p and p.lower().endswith(self.extensions)]
        if not relpaths:
            raise FileNotFoundError(
                f"ImageFolder: no files with extensions {self.extensions} under {self.root}/<class>/"
            )
        self.classes = sorted({p.split("/", 1)[0] for p in relpaths})
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.items = [(p, self.class_to_idx[p.split("/", 1)[0]]) for p in sorted(relpaths)]

    def _scan_local(self) -> list[str]:
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"ImageFolder: {self.root} is not a directory")
        out = []
        for entry in sorted(os.scandir(self.root), key=lambda e: e.name):
            if not entry.is_dir():
                continue
            for dirpath, _dirs, files in os.walk(entry.path, followlinks=True):
                rel = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
                out.extend(f"{rel}/{name}" for name in files)
        return out

    @property
    def samples(self) -> list[tuple[str, int]]:
        """[(path, class_index)] as in torchvision (URL-joined for a staged source)."""
        return [(self.describe(i), t) for i, (_, t) in enumerate(self.items)]

    @property
    def targets(self) -> list[int]:
        return [t for _, t in self.items]

    def _read(self, index: int) -> bytes:
        rel = self.items[index][0]
        if self._staged is not None:
            return self._staged.read(rel)
        with open(os.path.join(self.root, rel), "rb") as f:
            return f.read()

    def describe(self, index: int) -> str:
        rel = self.items[index][0]
        if self._staged is not None:
            return str(self._staged.describe(rel))
        return os.path.join(self.root, rel)

    def stats(self) -> dict[str, int]:
        """Staging counters (staged_items, staged_bytes, remote_bytes_read); empty for local roots."""
        return dict(self._staged.stats()) if self._staged is not None else {}

    def dataset_identity(self) -> str:
        """Root plus a digest of the file list: a changed file list never hits a stale cache."""
        return f"imagefolder:{self.root}:{self._list_digest()}"


class TorchvisionStyleSource:
    """Splits a torchvision-style dataset (``.samples`` of (path, target), ``.loader``, ``.transform``).

    ``fetch`` reads the file's bytes. ``prep`` rebuilds what ``loader(path)`` would return from
    those bytes: for torchvision's default loaders (recognised by name, torchvision is never
    imported) it decodes with simplejpeg into an RGB PIL image, as ``pil_loader`` would; a custom
    loader gets an in-memory file object named like the original (``Image.open`` accepts it), and
    if it rejects that (it calls ``open()`` or reads the name), a temporary file in /dev/shm holding
    the bytes. Then the user's ``transform``/``target_transform`` run unchanged.
    """

    thread_safe_fetch = True  # fetch only reads the file at the sample's path

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        loader = dataset.loader
        name = getattr(loader, "__name__", "")
        module = getattr(loader, "__module__", "") or ""
        self._fast_decode = module.startswith("torchvision") and name in ("pil_loader", "default_loader")
        self._loader_mode = "bytesio"  # switched to "tempfile" once when the loader rejects file objects

    def __len__(self) -> int:
        return len(self.dataset.samples)

    def describe(self, index: int) -> str:
        return os.fspath(self.dataset.samples[index][0])

    def fetch(self, index: int) -> bytes:
        with open(self.dataset.samples[index][0], "rb") as f:
            return f.read()

    def _load(self, raw: bytes, index: int) -> Any:
        path = self.describe(index)
        if self._fast_decode:
            from PIL import Image

            try:
                return Image.fromarray(decode_image(raw))
            except CorruptItemError as e:
                raise CorruptItemError(f"{path}: {e}", path=path, index=index) from e
        if self._loader_mode == "bytesio":
            buf = io.BytesIO(raw)
            buf.name = path  # some loaders look at the extension
            try:
                return self.dataset.loader(buf)
            except (TypeError, AttributeError):
                self._loader_mode = "tempfile"
        suffix = Path(path).suffix
        directory = "/dev/shm" if os.path.isdir("/dev/shm") else None
        with tempfile.NamedTemporaryFile(suffix=suffix, dir=directory) as tmp:
            tmp.write(raw)
            tmp.flush()
            return self.dataset.loader(tmp.name)

    def prep(self, raw: bytes, index: int) -> Any:
        """``(transform(loader(...)), target_transform(target))`` as the dataset's __getitem__ does."""
        target = self.dataset.samples[index][1]
        try:
            sample = self._load(raw, index)
        except CorruptItemError:
            raise
        except OSError as e:  # PIL.UnidentifiedImageError and truncation errors are OSErrors
            path = self.describe(index)
            raise CorruptItemError(f"{path}: {e}", path=path, index=index) from e
        transform = getattr(self.dataset, "transform", None)
        target_transform = getattr(self.dataset, "target_transform", None)
        if transform is not None:
            sample = transform(sample)
        if target_transform is not None:
            target = target_transform(target)
        return sample, target


class OpaqueSource:
    """Any map-style dataset, run as one stage: ``fetch`` returns b"", ``prep`` calls ``dataset[i]``.

    ``opaque = True`` tells the loader that raw bytes do not exist here: a raw-item cache
    (``cache_bytes``) cannot help and storage bytes cannot be counted.
    """

    opaque = True

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def fetch(self, index: int) -> bytes:
        return b""

    def prep(self, raw: bytes, index: int) -> Any:
        return self.dataset[index]

    def describe(self, index: int) -> str:
        return f"{type(self.dataset).__name__}[{index}]"


def _is_torchvision_style(ds: Any) -> bool:
    samples = getattr(ds, "samples", None)
    if not callable(getattr(ds, "loader", None)) or not isinstance(samples, Sequence) or not samples:
        return False
    first = samples[0]
    return isinstance(first, (tuple, list)) and len(first) == 2 and isinstance(first[0], (str, os.PathLike))


def as_item_source(dataset: Any) -> Any:
    """Adapt ``dataset`` to the fetch/prep protocol (see the module docstring for the three cases)."""
    if is_item_source(dataset):
        return dataset
    if _is_torchvision_style(dataset):
        return TorchvisionStyleSource(dataset)
    if callable(getattr(dataset, "__getitem__", None)) and callable(getattr(dataset, "__len__", None)):
        warnings.warn(
            f"coordl: {type(dataset).__name__} has no fetch/prep split (no fetch()/prep(), no .samples/.loader); "
            "it runs as one opaque stage, so only whole-sample caching applies and cache_bytes has no effect. "
            "Use coordl.ImageFolder / FileListDataset or add fetch(i)/prep(raw, i) to get the raw-item cache.",
            UserWarning,
            stacklevel=2,
        )
        return OpaqueSource(dataset)
    raise TypeError(
        f"coordl: cannot load from {type(dataset).__name__}: a dataset needs __len__ and __getitem__ "
        "(map-style) or __len__, fetch(i) and prep(raw, i)"
    )

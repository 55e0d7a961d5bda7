"""Static cache of the hottest nodes' features in shared memory (MinIO semantics, degree order).

Which nodes a sampled batch touches is skewed by degree: a node is picked as a neighbour about in
proportion to its out-degree, so the highest-out-degree nodes are gathered in almost every batch.
The cache holds exactly those (the first ``feature_cache_bytes // row_bytes`` nodes by out-degree,
ties by id), chosen once at construction and never evicted or replaced: like CoorDL's MinIO cache,
its hit ratio does not decay under random access the way the OS page cache's does.

Layout of its one :class:`shmem.segment.Segment` (``coordl-gfeat-...``, reclaimed after ``kill -9``
of its owner like every other segment): ``slot_of`` (int32 per node, -1 when not cached), one
``check`` word per slot (uint32, 0 while empty), then the rows. A slot is filled by whichever process
first reads its node from the file (all processes write the same bytes, so a race is harmless) and
its check word written after its row; :meth:`fill` fills every slot up front instead, reading hot rows
in file order.

A reader serves a row only if the row's bytes give its check word (the row's 32-bit words summed,
:func:`_check`). Written after the row is not enough on its own: another core may see the two stores
in the other order (ARM does; x86 does not), and nothing in Python orders them. A slot is written once
over zeros, so a row seen half written sums differently, and is read from the file instead. Rows are
never rewritten, so each process checks a row once (``_verified``, its own) and then only copies it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from shmem.segment import DEFAULT_DIR, Segment, free_bytes

if TYPE_CHECKING:
    from coordl.graph.graph import Graph

__all__ = ["FeatureCache", "gather_from_file"]

_ALIGN = 64


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _check(rows: np.ndarray) -> np.ndarray:
    """Per row, the check word of its bytes: the sum of its 32-bit words (mod 2**32 - 1), plus 1 (never 0)."""
    flat = np.ascontiguousarray(rows).reshape(len(rows), -1).view(np.uint8)
    pad = (-flat.shape[1]) % 4
    if pad:
        flat = np.concatenate([flat, np.zeros((len(rows), pad), dtype=np.uint8)], axis=1)
    sums = flat.view(np.uint32).sum(axis=1, dtype=np.uint64)  # summed in uint64 chunk by chunk, no copy
    return (sums % np.uint64(0xFFFFFFFF) + np.uint64(1)).astype(np.uint32)


def gather_from_file(features: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Rows ``features[ids]`` read in ascending id order (fewer, more sequential disk reads)."""
    order = np.argsort(ids, kind="stable")
    out = np.empty((ids.size,) + tuple(features.shape[1:]), dtype=features.dtype)
    out[order] = features[ids[order]]
    return out


class FeatureCache:
    """Features of the ``capacity_bytes // row_bytes`` highest-out-degree nodes, in shared memory.

    Args:
        graph: the graph whose ``features`` (usually a ``np.memmap``) are cached; its nodes with the
            largest ``out_degree`` are the ones kept.
        capacity_bytes: budget for feature rows; the index (4 bytes per node and 4 per slot) comes on top.
        directory: where the segment lives (``/dev/shm`` by default).

    Raises:
        MemoryError: the budget does not fit in ``directory``'s free space (the message says how much
            there is), instead of a bus error later.

    Picklable: workers attach to the same segment (a file-backed graph travels as its path).
    """

    def __init__(
        self,
        graph: Graph,
        capacity_bytes: int,
        directory: str | os.PathLike = DEFAULT_DIR,
    ) -> None:
        features = graph.features
        num_nodes = int(features.shape[0])
        row_bytes = features.dtype.itemsize * int(np.prod(features.shape[1:], dtype=np.int64))
        slots = int(min(num_nodes, max(0, capacity_bytes) // max(1, row_bytes)))
        self.graph = graph
        self.num_nodes, self.slots, self.row_bytes = num_nodes, slots, row_bytes
        self._segment: Segment | None = None
        if slots == 0:
            self._attach()
            return
        size = self._rows_offset() + slots * row_bytes
        seg = Segment.create("gfeat", size, directory)
        if not seg.reserve(0, size):
            free = free_bytes(directory)
            seg.close()
            raise MemoryError(
                f"feature_cache_bytes={capacity_bytes} needs {size} bytes in {os.fspath(directory)}, "
                f"which has {free} free: lower feature_cache_bytes or enlarge {os.fspath(directory)}"
            )
        self._segment = seg
        self._attach()
        hot = np.argsort(-np.asarray(graph.out_degree, dtype=np.int64), kind="stable")[:slots]
        self._slot_of[:] = -1
        self._slot_of[hot] = np.arange(slots, dtype=np.int32)

    def _rows_offset(self) -> int:
        return _align(self.num_nodes * 4) + _align(self.slots * 4)

    def _no_views(self) -> None:
        """Empty views: of a cache with no slots, and of a closed one (views go before the mapping)."""
        self._slot_of = np.full(0, -1, dtype=np.int32)
        self._filled = np.zeros(0, dtype=np.uint32)
        self._rows: np.ndarray = np.zeros(0, dtype=np.uint8)

    def _attach(self) -> None:
        if self._segment is None:
            self._no_views()
            return
        seg, feats = self._segment, self.graph.features
        self._slot_of = seg.array(np.int32, 0, self.num_nodes)
        self._filled = seg.array(np.uint32, _align(self.num_nodes * 4), self.slots)  # check words
        count = self.slots * (self.row_bytes // feats.dtype.itemsize)
        self._rows = seg.array(feats.dtype, self._rows_offset(), count).reshape(
            (self.slots, *feats.shape[1:])
        )
        self._verified = np.zeros(self.slots, dtype=bool)  # rows this process has seen whole

    # -- reads ----------------------------------------------------------------------------------

    def slot_of(self, ids: np.ndarray) -> np.ndarray:
        """Slot of each node, -1 for nodes outside the cache."""
        if self.slots == 0:
            return np.full(ids.shape, -1, dtype=np.int32)
        return self._slot_of[ids]

    def gather(self, ids: np.ndarray) -> tuple[np.ndarray, int, int]:
        """Features of ``ids`` (in order): from the cache where filled, else from the file.

        Returns ``(rows, hits, misses)``; misses of cached nodes are written into their slots.
        """
        ids = np.asarray(ids, dtype=np.int64)
        if self.slots == 0:
            return gather_from_file(self.graph.features, ids), 0, int(ids.size)
        slots = self._slot_of[ids]
        cached = slots >= 0
        hit = cached.copy()
        hit[cached] = self._filled[slots[cached]] != 0
        feats = self.graph.features
        out = np.empty((ids.size, *feats.shape[1:]), dtype=feats.dtype)
        out[hit] = self._rows[slots[hit]]
        got = np.flatnonzero(hit)
        got = got[~self._verified[slots[got]]]
        if got.size:  # only rows whose bytes give their check word (see the module's text)
            whole = _check(out[got]) == self._filled[slots[got]]
            hit[got[~whole]] = False
            self._verified[slots[got[whole]]] = True
        miss = np.flatnonzero(~hit)
        if miss.size:
            out[miss] = gather_from_file(feats, ids[miss])
            fill = miss[cached[miss] & (self._filled[np.maximum(slots[miss], 0)] == 0)]
            if fill.size:
                self._rows[slots[fill]] = out[fill]
                self._filled[slots[fill]] = _check(out[fill])  # after the row
                self._verified[slots[fill]] = True  # its own stores: this process sees them in order
        return out, int(hit.sum()), int(miss.size)

    def fill(self, chunk_rows: int = 1 << 14) -> None:
        """Fill every empty slot now, reading the hot rows in file order (sequential reads)."""
        if self.slots == 0:
            return
        hot = np.flatnonzero(self._slot_of >= 0)  # ascending node id = file order
        for start in range(0, hot.size, chunk_rows):
            ids = hot[start : start + chunk_rows]
            ids = ids[self._filled[self._slot_of[ids]] == 0]
            if ids.size:
                rows = np.asarray(self.graph.features[ids])
                self._rows[self._slot_of[ids]] = rows
                self._filled[self._slot_of[ids]] = _check(rows)
                self._verified[self._slot_of[ids]] = True

    @property
    def filled(self) -> int:
        """Slots filled so far."""
        return int(np.count_nonzero(self._filled)) if self.slots else 0

    @property
    def path(self) -> str | None:
        """The segment's file, or None when the cache is empty."""
        return self._segment.path if self._segment is not None else None

    def close(self) -> None:
        """Unmap (and, in the owner, remove) the segment."""
        self._no_views()
        if self._segment is not None:
            self._segment.close()
            self._segment = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for k in ("_slot_of", "_filled", "_rows", "_verified"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._attach()

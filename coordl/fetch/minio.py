"""MinIO cache: raw item bytes in shared memory, filled once, never evicted.

The OS page cache evicts under random access: when a dataset is larger than memory, an epoch in a
random order hits far less than the cached fraction (CoorDL, Mohan et al., VLDB 2021). MinIO keeps
the first items fetched until the budget is full and never replaces them, so from the second epoch
the hit ratio equals the cached fraction exactly, whatever the access order.

Storage: the project's one never-evicting shared-memory table (:class:`shmem.table.AppendTable`, read a
batch of rows at a time: :class:`shmem.dense.DenseTable`), one
row per item (``dense``), in one segment reclaimed when its owner dies. Writers claim space under a
file lock and reserve pages first (a full ``/dev/shm`` is a clean "full", never SIGBUS); readers take
no lock and serve an item only when its checksum matches, which makes publication safe on weakly
ordered CPUs too and means a writer killed mid-copy is never served (see :mod:`shmem.table`).
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from collections.abc import Sequence
from typing import Any, cast

from shmem.dense import DenseTable
from shmem.segment import DEFAULT_DIR, Segment, free_bytes, reclaim_stale
from shmem.table import table_bytes

__all__ = ["MinioCache", "default_file_dir"]

log = logging.getLogger(__name__)


def default_file_dir() -> str:
    """Where the file-backed fallback lives when ``cache_dir`` is not given."""
    return os.path.join(tempfile.gettempdir(), "coordl")


class MinioCache:
    """A shared, never-evicting cache of the raw bytes of items ``0 .. num_items-1``.

    Args:
        capacity_bytes: the budget for item bytes (index overhead: 40 bytes per item, extra).
        num_items: the number of items of the dataset (the index has one row per item).
        directory: where the segments live. ``None``: ``/dev/shm`` when it has room for the budget,
            else a file-backed mapping in :func:`default_file_dir`, with a warning naming the fix.
        name: a label used in log messages and the warning (e.g. the dataset's name).

    Picklable: workers (fork or spawn) unpickle it and attach to the same segments.
    """

    def __init__(
        self,
        capacity_bytes: int,
        num_items: int,
        *,
        directory: str | os.PathLike | None = None,
        name: str | None = None,
    ) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"cache_bytes must be > 0, got {capacity_bytes}")
        if num_items < 0:
            raise ValueError(f"num_items must be >= 0, got {num_items}")
        self.capacity_bytes = int(capacity_bytes)
        self.num_items = int(num_items)
        self.name = name or "minio"
        self.directory = self._choose_directory(directory)
        self.backend = "shm" if os.path.realpath(self.directory) == os.path.realpath(DEFAULT_DIR) else "file"
        size = table_bytes(self.num_items, self.capacity_bytes, dense=True)
        self._segment = Segment.create("minio", size, self.directory)
        try:
            table = DenseTable.create(self._segment, self.num_items, self.capacity_bytes, dense=True)
            self._table = cast(DenseTable, table)  # create() makes the class it is called on
        except BaseException:
            self._segment.close()
            raise
        self._full_logged = False

    @classmethod
    def attach(cls, path: str, capacity_bytes: int, num_items: int, *, name: str | None = None) -> MinioCache:
        """The cache another process created at ``path`` (for the same budget and items), shared, not owned.

        Raises ``FileNotFoundError`` when it is gone.
        """
        directory = os.path.dirname(path)
        backend = "shm" if os.path.realpath(directory) == os.path.realpath(DEFAULT_DIR) else "file"
        cache = cls.__new__(cls)
        cache.__setstate__({
            "capacity_bytes": int(capacity_bytes), "num_items": int(num_items), "name": name or "minio",
            "directory": directory, "backend": backend, "segment": Segment.attach(path),
        })  # fmt: skip
        return cache

    def _choose_directory(self, directory: str | os.PathLike | None) -> str:
        reclaim_stale(DEFAULT_DIR)
        if directory is not None:
            directory = os.fspath(directory)
            os.makedirs(directory, exist_ok=True)
            reclaim_stale(directory)
            self._warn_if_small(directory, explicit=True)
            return directory
        if os.path.isdir(DEFAULT_DIR) and free_bytes(DEFAULT_DIR) >= self.capacity_bytes:
            return DEFAULT_DIR
        fallback = default_file_dir()
        os.makedirs(fallback, exist_ok=True)
        reclaim_stale(fallback)
        have = free_bytes(DEFAULT_DIR) if os.path.isdir(DEFAULT_DIR) else 0
        warnings.warn(
            f"coordl: cache_bytes={self.capacity_bytes} exceeds the {have} bytes free in {DEFAULT_DIR}; "
            f"the {self.name} cache uses a file-backed mapping in {fallback} instead (slower when the OS "
            f"evicts its pages). Fix: give the container more shared memory (docker run "
            f"--shm-size={_round_up_gib(self.capacity_bytes)}g ...), or pass cache_dir= a directory on a "
            f"disk or tmpfs with room.",
            RuntimeWarning,
            stacklevel=4,
        )
        self._warn_if_small(fallback, explicit=False)
        return fallback

    def _warn_if_small(self, directory: str, *, explicit: bool) -> None:
        have = free_bytes(directory)
        if have < self.capacity_bytes:
            where = f"cache_dir={directory!r}" if explicit else directory
            warnings.warn(
                f"coordl: {where} has {have} bytes free, less than cache_bytes={self.capacity_bytes}; "
                f"the cache stops filling when the disk is full (no crash).",
                RuntimeWarning,
                stacklevel=5,
            )

    # -- reading: no lock, a checked view ----------------------------------------------------------

    def get(self, index: int) -> memoryview | None:
        """A read-only view of item ``index``'s bytes, or None when it is not cached."""
        return self._table.get(index + 1)

    def get_many(self, indices: Sequence[int], *, copy: bool = False) -> list[Any]:
        """:meth:`get` of each of ``indices`` (a batch's worth in one call: the rows read at once,
        :meth:`shmem.dense.DenseTable.get_rows`); ``copy``: as ``bytes``, not views."""
        return self._table.get_rows(indices, copy=copy)  # item i is the key i + 1, in row i

    def __contains__(self, index: int) -> bool:
        return 0 <= index < self.num_items and (index + 1, 0) in self._table

    # -- writing -----------------------------------------------------------------------------------

    def put(self, index: int, raw: bytes | bytearray | memoryview) -> bool:
        """Cache ``raw`` as item ``index``. False when already cached (or being written) or full."""
        if not 0 <= index < self.num_items:
            raise IndexError(f"item {index} is outside the cache's 0..{self.num_items - 1}")
        stored = self._table.put(index + 1, 0, (raw,))
        # ``full`` reads one header word: a miss offered to a cache with no room left costs no dict.
        if not stored and not self._full_logged and self._table.full:
            self._full_logged = True
            used = self._table.stats()["used_bytes"]
            if used + len(raw) <= self.capacity_bytes:  # the file system ran out before the budget did
                log.warning("%s cache: %s is full at %d bytes", self.name, self.directory, used)
        return stored

    # -- bookkeeping -------------------------------------------------------------------------------

    def stats(self) -> dict[str, int | str]:
        """``cached_items``, ``cached_bytes``, ``capacity_bytes``, ``cache_backend`` ("shm"/"file")."""
        table = self._table.stats()
        return {
            "cached_items": table["items"],
            "cached_bytes": table["value_bytes"],
            "capacity_bytes": self.capacity_bytes,
            "cache_backend": self.backend,
        }

    @property
    def paths(self) -> tuple[str]:
        """The file backing the cache (for leak checks and diagnostics)."""
        return (self._segment.path,)

    def close(self) -> None:
        """Unmap; the creating process also removes the file. Views from :meth:`get` must be gone."""
        self._table.close()
        self._segment.close()

    def __getstate__(self) -> dict:
        state = {k: getattr(self, k) for k in ("capacity_bytes", "num_items", "name", "directory", "backend")}
        state["segment"] = self._segment
        return state

    def __setstate__(self, state: dict) -> None:
        for k in ("capacity_bytes", "num_items", "name", "directory", "backend"):
            setattr(self, k, state[k])
        self._segment = state["segment"]
        self._table = DenseTable(self._segment)
        self._full_logged = False

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"MinioCache({s['cached_bytes']}/{self.capacity_bytes} bytes, {s['cached_items']}/"
            f"{self.num_items} items, {self.backend} in {self.directory})"
        )


def _round_up_gib(n_bytes: int) -> int:
    return max(1, -(-n_bytes // (1 << 30)) + 1)

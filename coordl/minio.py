"""MinIO cache: raw item bytes in shared memory, filled once, never evicted.

The OS page cache evicts under random access: when a dataset is larger than memory, an epoch in a
random order hits far less than the cached fraction (CoorDL, Mohan et al., VLDB 2021). MinIO keeps
the first items fetched until the budget is full and never replaces them, so from the second epoch
the hit ratio equals the cached fraction exactly, whatever the access order.

Layout: one data segment of ``capacity_bytes`` and one index segment holding a small header (bump
pointer, flags) and one row per item: ``(offset, length, state)``. Space is handed out by a bump
allocator under an ``fcntl`` lock on the index file (cross-process, works for fork and spawn). A
writer reserves its pages (``posix_fallocate``: a full ``/dev/shm`` gives a clean "full", never a
SIGBUS), copies the bytes, and only then publishes ``READY``. A reader never locks: it reads the row
and, when ``READY``, returns a view of bytes that will never change again. A writer killed mid-copy
leaves ``WRITING``, which is never served.
"""

from __future__ import annotations

import fcntl
import logging
import os
import tempfile
import threading
import warnings

import numpy as np

from coordl.shm import DEFAULT_DIR, Segment, free_bytes, reclaim_stale

__all__ = ["MinioCache", "default_file_dir"]

log = logging.getLogger(__name__)

EMPTY, WRITING, READY = 0, 1, 2
_HEADER_WORDS = 8  # [0] bump pointer, [1] items ready, [2] bytes ready, rest spare
_ROW = 3  # offset, length, state


def default_file_dir() -> str:
    """Where the file-backed fallback lives when ``cache_dir`` is not given."""
    return os.path.join(tempfile.gettempdir(), "coordl")


class MinioCache:
    """A shared, never-evicting cache of the raw bytes of items ``0 .. num_items-1``.

    Args:
        capacity_bytes: the budget for item bytes (index overhead: 24 bytes per item, extra).
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
        index_bytes = (_HEADER_WORDS + _ROW * self.num_items) * 8
        self._index_seg = Segment.create("minio_idx", index_bytes, self.directory)
        if not self._index_seg.reserve(0, index_bytes):
            self._index_seg.close()
            raise OSError(f"no room for the MinIO index ({index_bytes} bytes) in {self.directory}")
        self._data_seg = Segment.create("minio", self.capacity_bytes, self.directory)
        self._attach()

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

    def _attach(self) -> None:
        self._header = self._index_seg.array(np.int64, 0, _HEADER_WORDS)
        self._rows = self._index_seg.array(np.int64, _HEADER_WORDS * 8, _ROW * self.num_items).reshape(
            self.num_items, _ROW
        )
        self._data = self._data_seg.buf
        self._lock_fd: int | None = None
        self._lock_pid = -1
        self._thread_lock = threading.Lock()  # flock does not exclude threads sharing a descriptor

    # -- reading: no lock, a row read and a view ---------------------------------------------------

    def get(self, index: int) -> memoryview | None:
        """A read-only view of item ``index``'s bytes, or None when it is not cached."""
        row = self._rows[index]
        if row[2] != READY:
            return None
        offset = int(row[0])
        return self._data[offset : offset + int(row[1])].toreadonly()

    def __contains__(self, index: int) -> bool:
        return 0 <= index < self.num_items and self._rows[index, 2] == READY

    # -- writing: allocate under the lock, copy without it, then publish ---------------------------

    def put(self, index: int, raw: bytes | bytearray | memoryview) -> bool:
        """Cache ``raw`` as item ``index``. False when already cached (or being written) or full."""
        if not 0 <= index < self.num_items:
            raise IndexError(f"item {index} is outside the cache's 0..{self.num_items - 1}")
        length = len(raw)
        # Cheap unlocked checks first: once full, misses cost no lock.
        if self._rows[index, 2] != EMPTY or self._header[0] + length > self.capacity_bytes:
            return False
        with self._locked():
            if self._rows[index, 2] != EMPTY:
                return False
            offset = int(self._header[0])
            if offset + length > self.capacity_bytes or not self._data_seg.reserve(offset, length):
                if offset + length <= self.capacity_bytes:
                    # The file system ran out before the budget did: stop filling for good.
                    log.warning("%s cache: %s is full at %d bytes", self.name, self.directory, offset)
                    self._header[0] = self.capacity_bytes
                return False
            self._header[0] = offset + length
            self._rows[index, 0] = offset
            self._rows[index, 1] = length
            self._rows[index, 2] = WRITING
        self._data[offset : offset + length] = raw
        # Publish after the copy: x86 keeps store order, and the state write is a separate store.
        self._rows[index, 2] = READY
        with self._locked():
            self._header[1] += 1
            self._header[2] += length
        return True

    def _locked(self) -> _FileLock:
        pid = os.getpid()
        if self._lock_fd is None or self._lock_pid != pid:
            # One descriptor per process: flock locks belong to the open file, not the process.
            self._lock_fd = os.open(self._index_seg.path, os.O_RDONLY)
            self._lock_pid = pid
        return _FileLock(self._lock_fd, self._thread_lock)

    # -- bookkeeping -------------------------------------------------------------------------------

    def stats(self) -> dict[str, int | str]:
        """``cached_items``, ``cached_bytes``, ``capacity_bytes``, ``cache_backend`` ("shm"/"file")."""
        return {
            "cached_items": int(self._header[1]),
            "cached_bytes": int(self._header[2]),
            "capacity_bytes": self.capacity_bytes,
            "cache_backend": self.backend,
        }

    @property
    def paths(self) -> tuple[str, str]:
        """The files backing the index and the data (for leak checks and diagnostics)."""
        return self._index_seg.path, self._data_seg.path

    def close(self) -> None:
        """Unmap; the creating process also removes the files. Views from :meth:`get` must be gone."""
        if self._lock_fd is not None and self._lock_pid == os.getpid():
            os.close(self._lock_fd)
        self._lock_fd = None
        self._header = self._rows = None
        self._data = None
        self._index_seg.close()
        self._data_seg.close()

    def __getstate__(self) -> dict:
        return {
            "capacity_bytes": self.capacity_bytes,
            "num_items": self.num_items,
            "name": self.name,
            "directory": self.directory,
            "backend": self.backend,
            "index_seg": self._index_seg,
            "data_seg": self._data_seg,
        }

    def __setstate__(self, state: dict) -> None:
        self.capacity_bytes = state["capacity_bytes"]
        self.num_items = state["num_items"]
        self.name = state["name"]
        self.directory = state["directory"]
        self.backend = state["backend"]
        self._index_seg = state["index_seg"]
        self._data_seg = state["data_seg"]
        self._attach()

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"MinioCache({s['cached_bytes']}/{self.capacity_bytes} bytes, {s['cached_items']}/"
            f"{self.num_items} items, {self.backend} in {self.directory})"
        )


class _FileLock:
    """``with`` block holding a thread lock and an exclusive flock on an open descriptor."""

    def __init__(self, fd: int, thread_lock: threading.Lock) -> None:
        self._fd = fd
        self._thread_lock = thread_lock

    def __enter__(self) -> None:
        self._thread_lock.acquire()
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._thread_lock.release()


def _round_up_gib(n_bytes: int) -> int:
    return max(1, -(-n_bytes // (1 << 30)) + 1)

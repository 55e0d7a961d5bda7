"""LocalStore: the embedded sample cache, one shared-memory table per node, no server.

Every process that opens a store of the same ``name`` (all DataLoader workers of all jobs on the node)
maps the same file ``<directory>/coordl-memcache-<name>``, so a sample prepped by one worker is a hit for
every other worker and job. MinIO semantics: values are appended until the byte budget is used, then
puts stop; nothing is ever evicted or overwritten, which is what makes lock-free reads safe.

Layout of the file: a 4 KiB header (magic, size, table of attached processes), then the project's one
never-evicting shared-memory table (:class:`shmem.table.AppendTable`) keyed by a 128-bit digest of each
key, holding encoded values (see :mod:`memcache.codec`). Writers claim space under an ``flock``; readers
take no lock and serve a value only when the table's checksum over it matches, so a half-written value
(or one seen early on a weakly ordered CPU) is at worst a miss. Each value also carries its key tag,
checked on read.

Lifecycle: each process that uses the store records its pid and start time in the header. ``close()``
(also run at interpreter exit) removes this process; the last live process removes the file. A store
whose processes all died (``kill -9``) is removed by the next process that opens any LocalStore in the
same directory. Memory is reserved with ``posix_fallocate`` before it is written, so a full ``/dev/shm``
stops puts instead of killing workers with SIGBUS.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import os
import re
import threading
from collections.abc import Iterable, Mapping

import numpy as np

from memcache.codec import CodecError, decode, encode_parts
from shmem import members
from shmem.segment import DEFAULT_DIR, Segment, flock_timeout
from shmem.table import AppendTable, table_bytes

__all__ = ["LocalStore"]

_MAGIC = int.from_bytes(b"MCLSTOR1", "little")
_HEADER_BYTES = 4096
_MAX_ATTACH = 200
# Header words (int64): magic, file size; pairs (pid, start ticks) of attached processes from _H_ATTACH.
_H_MAGIC, _H_SIZE = range(2)
_H_ATTACH = 16
_LOCK_TIMEOUT_S = 30.0
_NAME_RE = re.compile(r"[A-Za-z0-9_.]{1,64}")
_FILE_PREFIX = "coordl-memcache-"


def _digest(key: str) -> tuple[int, int]:
    d = hashlib.blake2b(key.encode(), digest_size=16).digest()
    # signed 64-bit halves, lo never 0 (0 marks an empty row of the table)
    return int.from_bytes(d[:8], "little", signed=True) | 1, int.from_bytes(d[8:], "little", signed=True)


def _lock(fd: int, path: str, timeout_s: float = _LOCK_TIMEOUT_S) -> None:
    flock_timeout(fd, timeout_s, f"LocalStore {path}: writer lock")


def _attached(header: np.ndarray) -> np.ndarray:
    """The table of attached processes in a store's header (rows of pid, start ticks)."""
    return header[_H_ATTACH : _H_ATTACH + 2 * _MAX_ATTACH].reshape(_MAX_ATTACH, 2)


def reclaim_stale_stores(directory: str | os.PathLike = DEFAULT_DIR) -> list[str]:
    """Remove stores in ``directory`` none of whose attached processes is alive. Returns their paths."""
    removed: list[str] = []
    try:
        names = [n for n in os.listdir(directory) if n.startswith(_FILE_PREFIX)]
    except FileNotFoundError:
        return removed
    for name in names:
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # busy: someone is using it, skip
            raw = os.pread(fd, _HEADER_BYTES, 0)
            header = np.frombuffer(raw.ljust(_HEADER_BYTES, b"\0"), dtype=np.int64)
            if not members.live_pids(_attached(header)) and os.path.exists(path):
                os.unlink(path)
                removed.append(path)
        except BlockingIOError:
            pass
        finally:
            os.close(fd)
    return removed


class LocalStore:
    """Embedded sample cache shared by every process of the node that opens the same ``name``.

    Args:
        capacity_bytes: all the shared memory the store may use (header, index and values). The first
            process to open ``name`` sets it; later ones use the existing store's size.
        name: which store on the node ([A-Za-z0-9_.], default ``"default"``).
        directory: where the file lives; ``/dev/shm`` (RAM) by default.
        max_items: size of the index (default: one slot pair per 4 KiB of capacity); puts stop when
            either the bytes or the index run out.
        verify: check each value's CRC-32 on every read (default): this is what makes a value seen
            before its bytes on a weakly ordered CPU (aarch64) a miss, not a wrong sample. The header
            and key tag are always checked. ``verify=False`` reads at the speed of a copy and is safe
            only on x86-64, where stores become visible in order.

    The constructing process attaches at once; it keeps the store alive until it calls :meth:`close`
    or exits. Picklable: only the arguments travel; each process maps the file itself.
    """

    def __init__(
        self,
        capacity_bytes: int,
        name: str = "default",
        directory: str | os.PathLike = DEFAULT_DIR,
        max_items: int | None = None,
        verify: bool = True,
    ) -> None:
        if not _NAME_RE.fullmatch(name):
            raise ValueError(f"LocalStore name must match [A-Za-z0-9_.]{{1,64}}, got {name!r}")
        if capacity_bytes < 1 << 20:
            raise ValueError(f"LocalStore capacity_bytes must be at least 1 MiB, got {capacity_bytes}")
        self.capacity_bytes = int(capacity_bytes)
        self.name = name
        self.directory = os.fspath(directory)
        self.max_items = int(max_items) if max_items else max(1024, self.capacity_bytes // 4096)
        self.verify = verify
        self.path = os.path.join(self.directory, _FILE_PREFIX + name)
        self._pid = -1
        self._mutex = threading.Lock()
        self._reset_local_stats()
        # Attach now: the constructing process (the training job) keeps the store alive between
        # epochs, when non-persistent DataLoader workers have exited and no other process holds it.
        self._ensure()

    # ---- per-process attachment -------------------------------------------------------------
    def _reset_local_stats(self) -> None:
        self._stats = dict.fromkeys(("hits", "misses", "errors", "puts", "put_bytes", "put_rejected"), 0)

    def _ensure(self) -> None:
        if self._pid == os.getpid():
            return
        with self._mutex:
            if self._pid != os.getpid():
                self._attach()

    def _attach(self) -> None:
        # A forked child inherits the parent's mapping and fd: drop them (never close: they are the
        # parent's too) and map the file again as this process.
        self._seg = None
        self._reset_local_stats()
        os.makedirs(self.directory, exist_ok=True)
        reclaim_stale_stores(self.directory)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            _lock(fd, self.path)
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the last user removed it between our open and our lock: open it again
        try:
            if os.fstat(fd).st_size == 0:
                self._size_file(fd)
            seg = self._seg = Segment.attach(self.path)
            magic = int(seg.array(np.int64, 0, 1)[0])
            if magic == 0:  # new, or its creator died before laying it out: lay it out (under the lock)
                self._initialize(fd, seg)
            elif magic != _MAGIC:
                raise ValueError(f"{self.path} is not a memcache LocalStore (bad magic); remove it")
            self._header = seg.array(np.int64, 0, _HEADER_BYTES // 8)
            self._table = AppendTable(seg, _HEADER_BYTES)
            members.join(_attached(self._header), what=f"LocalStore {self.path}: attached processes")
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        self._fd = fd
        self._pid = os.getpid()
        atexit.register(self.close)

    def _size_file(self, fd: int) -> None:
        """A new store's file: its full size, sparse (the caller holds the lock)."""
        if _HEADER_BYTES + table_bytes(self.max_items, 0) + (1 << 16) > self.capacity_bytes:
            raise ValueError(
                f"LocalStore {self.name!r}: capacity_bytes={self.capacity_bytes} leaves no room for values "
                f"after an index of {self.max_items} items; raise capacity_bytes or lower max_items"
            )
        os.ftruncate(fd, self.capacity_bytes)

    def _initialize(self, fd: int, seg: Segment) -> None:
        """Lay out the header and the table in a new store's file (the caller holds the lock)."""
        index_bytes = table_bytes(self.max_items, 0)
        data_bytes = self.capacity_bytes - _HEADER_BYTES - index_bytes
        try:
            if not seg.reserve(0, _HEADER_BYTES):
                raise OSError(28, "no space")
            AppendTable.create(
                seg, self.max_items, data_bytes, stop_when_full=True, base=_HEADER_BYTES
            ).close()
        except OSError as e:
            os.ftruncate(fd, 0)
            raise OSError(
                e.errno, f"LocalStore {self.path}: no room for its index in {self.directory}"
            ) from e
        header = seg.array(np.int64, 0, _HEADER_BYTES // 8)
        header[_H_SIZE] = self.capacity_bytes
        header[_H_MAGIC] = _MAGIC  # last: a half-made store is never taken for one

    # ---- the store interface ----------------------------------------------------------------
    def get_many(self, keys: Iterable[str], *, copy: bool = True) -> dict[str, np.ndarray]:
        """Arrays of the keys present; a missing or invalid value is left out.

        Args:
            copy: return private writable copies (default). ``copy=False`` returns read-only views
                of the shared memory: no copy and no fresh pages, for consumers that never write
                into their input; the views stay valid until this handle is closed.
        """
        self._ensure()
        table = self._table
        out: dict[str, np.ndarray] = {}
        for key in keys:
            torn = table.torn_reads
            view = table.get(*_digest(key), verify=self.verify)
            if view is None:
                self._stats["misses"] += 1
                self._stats["errors"] += table.torn_reads - torn  # present, but its check failed
                continue
            try:
                # The table checked a CRC over the whole value: the codec's own CRC would repeat it.
                out[key] = decode(key, view, copy=copy, verify=False)
                self._stats["hits"] += 1
            except CodecError:
                self._stats["errors"] += 1
                self._stats["misses"] += 1
        return out

    def put_many(self, items: Mapping[str, np.ndarray]) -> int:
        """Store values not yet present; returns how many were stored. Stops (never raises) when full."""
        self._ensure()
        stored = 0
        for n, (key, array) in enumerate(items.items()):
            if self._table.stats()["full"]:
                self._stats["put_rejected"] += len(items) - n
                break
            parts = encode_parts(key, array)
            if self._table.put(*_digest(key), parts):
                stored += 1
                self._stats["put_bytes"] += sum(memoryview(p).nbytes for p in parts)
            elif _digest(key) not in self._table:
                self._stats["put_rejected"] += 1  # no room (present values are not a rejection)
        self._stats["puts"] += stored
        return stored

    def stats(self) -> dict[str, int]:
        """This process's hits/misses/errors/puts plus the store's items, used and capacity bytes."""
        self._ensure()
        table = self._table.stats()
        return {
            **self._stats,
            "items": table["items"],
            "used_bytes": self.capacity_bytes - table["data_bytes"] + table["used_bytes"],
            "capacity_bytes": int(self._header[_H_SIZE]),
            "full": table["full"],
        }

    def close(self) -> None:
        """Detach this process; the last live process removes the store."""
        if self._pid != os.getpid():
            return
        atexit.unregister(self.close)
        _lock(self._fd, self.path)
        try:
            members.leave(_attached(self._header))  # one row per handle: another handle keeps its own
            if not members.live_pids(_attached(self._header)) and os.path.exists(self.path):
                os.unlink(self.path)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
        self._table.close()  # drops its views of the segment
        self._header = np.empty(0, np.int64)  # and this one, before unmapping
        if self._seg is not None:
            self._seg.close()
        self._seg = None
        self._pid = -1

    def __getstate__(self) -> dict:
        return {k: getattr(self, k) for k in ("capacity_bytes", "name", "directory", "max_items", "verify")}

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, **state)

    def __repr__(self) -> str:
        return f"LocalStore(capacity_bytes={self.capacity_bytes}, name={self.name!r}, directory={self.directory!r})"

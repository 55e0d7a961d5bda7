"""LocalStore: the embedded sample cache, one shared-memory table per node, no server.

Every process that opens a store of the same ``name`` (all DataLoader workers of all jobs on the node)
maps the same file ``<directory>/coordl-memcache-<name>``, so a sample prepped by one worker is a hit for
every other worker and job. MinIO semantics: values are appended until the byte budget is used, then
puts stop; nothing is ever evicted or overwritten, which is what makes lock-free reads safe.

Layout of the file: a 4 KiB header (sizes, fill pointer, item count, full flag, table of attached
processes), an open-addressing index of 32-byte slots (16-byte key digest, offset, length), then the
data region of encoded values (see :mod:`memcache.codec`). Writers take an ``flock`` on the file;
readers take no lock: a writer fills a slot's offset and length before its digest, and a reader checks
each value's key tag and checksum, so a half-written value is at worst a counted miss.

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

from coordl.shm import DEFAULT_DIR, Segment, flock_timeout, owner_alive, start_ticks
from memcache.codec import CodecError, decode, encode_header, payload_view

__all__ = ["LocalStore"]

_MAGIC = int.from_bytes(b"MCLSTOR1", "little")
_HEADER_BYTES = 4096
_SLOT_WORDS = 4  # digest lo, digest hi, offset, length
_MAX_ATTACH = 200
# Header words (int64): magic, file size, slots, data offset, data bytes, fill, items, full, reserved.
_H_MAGIC, _H_SIZE, _H_SLOTS, _H_DATA_OFF, _H_DATA_BYTES, _H_FILL, _H_ITEMS, _H_FULL, _H_RESERVED = range(9)
_H_ATTACH = 16  # pairs (pid, start ticks) from here on
_RESERVE_CHUNK = 8 << 20  # fallocate in chunks: one syscall per 8 MiB, not per value
_LOCK_TIMEOUT_S = 30.0
_NAME_RE = re.compile(r"[A-Za-z0-9_.]{1,64}")
_FILE_PREFIX = "coordl-memcache-"


def _digest(key: str) -> tuple[int, int]:
    d = hashlib.blake2b(key.encode(), digest_size=16).digest()
    return int.from_bytes(d[:8], "little") | 1, int.from_bytes(d[8:], "little")  # lo never 0: 0 = empty


def _lock(fd: int, path: str, timeout_s: float = _LOCK_TIMEOUT_S) -> None:
    flock_timeout(fd, timeout_s, f"LocalStore {path}: writer lock")


def _live_pids(header: np.ndarray) -> list[int]:
    pairs = header[_H_ATTACH : _H_ATTACH + 2 * _MAX_ATTACH].reshape(_MAX_ATTACH, 2)
    return [int(p) for p, s in pairs if p and owner_alive(int(p), int(s))]


def reclaim_stale_stores(directory: str | os.PathLike = DEFAULT_DIR) -> list[str]:
    """Remove stores in ``directory`` none of whose attached processes is alive. Returns their paths."""
    removed = []
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
            if not _live_pids(header) and os.path.exists(path):
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
        verify: check each value's CRC-32 on every read (default). The header and key tag are always
            checked; values are published only when complete and never overwritten, so the CRC
            guards only against foreign writes to the file. ``verify=False`` reads at the speed of a copy.

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
                self._initialize(fd)
            self._seg = Segment.attach(self.path)
            self._header = self._seg.array(np.int64, 0, _HEADER_BYTES // 8)
            if int(self._header[_H_MAGIC]) != _MAGIC:
                raise ValueError(f"{self.path} is not a memcache LocalStore (bad magic); remove it")
            self._register(os.getpid())
            slots = int(self._header[_H_SLOTS])
            self._slots = self._seg.buf[_HEADER_BYTES : _HEADER_BYTES + slots * 32].cast("Q")
            self._mask = slots - 1
            self._data_off = int(self._header[_H_DATA_OFF])
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        self._fd = fd
        self._pid = os.getpid()
        atexit.register(self.close)

    def _initialize(self, fd: int) -> None:
        slots = 1 << max(10, (2 * self.max_items - 1).bit_length())  # load factor <= 1/2
        index_bytes = slots * 32
        data_off = _HEADER_BYTES + index_bytes
        if data_off + (1 << 16) > self.capacity_bytes:
            raise ValueError(
                f"LocalStore {self.name!r}: capacity_bytes={self.capacity_bytes} leaves no room for values "
                f"after a {index_bytes}-byte index; raise capacity_bytes or lower max_items"
            )
        os.ftruncate(fd, self.capacity_bytes)
        try:
            os.posix_fallocate(fd, 0, data_off)  # header + index are touched at random: back them now
        except OSError as e:
            os.ftruncate(fd, 0)
            raise OSError(
                e.errno, f"LocalStore {self.path}: no room for its index in {self.directory}"
            ) from e
        header = np.zeros(_HEADER_BYTES // 8, dtype=np.int64)
        header[[_H_SIZE, _H_SLOTS, _H_DATA_OFF]] = self.capacity_bytes, slots, data_off
        header[_H_DATA_BYTES] = self.capacity_bytes - data_off
        header[_H_MAGIC] = _MAGIC
        os.pwrite(fd, header.tobytes(), 0)

    def _register(self, pid: int) -> None:
        """Record ``pid`` in the attach table, dropping dead entries (caller holds the lock)."""
        pairs = self._header[_H_ATTACH : _H_ATTACH + 2 * _MAX_ATTACH].reshape(_MAX_ATTACH, 2)
        for row in pairs:
            if row[0] and not owner_alive(int(row[0]), int(row[1])):
                row[:] = 0
        free = [i for i in range(_MAX_ATTACH) if pairs[i, 0] == 0]
        if not free:
            raise RuntimeError(f"LocalStore {self.path}: more than {_MAX_ATTACH} live processes attached")
        pairs[free[0]] = (pid, start_ticks(pid))

    # ---- the store interface ----------------------------------------------------------------
    def get_many(self, keys: Iterable[str], *, copy: bool = True) -> dict[str, np.ndarray]:
        """Arrays of the keys present; a missing or invalid value is left out.

        Args:
            copy: return private writable copies (default). ``copy=False`` returns read-only views
                of the shared memory: no copy and no fresh pages, for consumers that never write
                into their input; the views stay valid until this handle is closed.
        """
        self._ensure()
        slots, mask, buf, base = self._slots, self._mask, self._seg.buf, self._data_off
        out: dict[str, np.ndarray] = {}
        for key in keys:
            lo, hi = _digest(key)
            i = lo & mask
            while True:
                s = slots[4 * i]
                if s == 0:
                    self._stats["misses"] += 1
                    break
                if s == lo and slots[4 * i + 1] == hi:
                    off, length = slots[4 * i + 2], slots[4 * i + 3]
                    try:
                        out[key] = decode(
                            key, buf[base + off : base + off + length], copy=copy, verify=self.verify
                        )
                        self._stats["hits"] += 1
                    except CodecError:
                        self._stats["errors"] += 1
                        self._stats["misses"] += 1
                    break
                i = (i + 1) & mask
        return out

    def put_many(self, items: Mapping[str, np.ndarray]) -> int:
        """Store values not yet present; returns how many were stored. Stops (never raises) when full."""
        self._ensure()
        if self._header[_H_FULL]:
            self._stats["put_rejected"] += len(items)
            return 0
        encoded = [(k, encode_header(k, a), payload_view(a)) for k, a in items.items()]
        stored = 0
        _lock(self._fd, self.path)
        try:
            for n, (key, head, payload) in enumerate(encoded):
                if not self._put_locked(key, head, payload):
                    self._stats["put_rejected"] += len(encoded) - n
                    break
                stored += 1
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._stats["puts"] += stored
        return stored

    def _put_locked(self, key: str, head: bytes, payload: memoryview) -> bool:
        h, slots, mask = self._header, self._slots, self._mask
        lo, hi = _digest(key)
        i = lo & mask
        while slots[4 * i] != 0:
            if slots[4 * i] == lo and slots[4 * i + 1] == hi:
                return True  # another worker stored it first: values are never overwritten
            i = (i + 1) & mask
        length = len(head) + payload.nbytes
        fill = int(h[_H_FILL])
        end = fill + ((length + 7) & ~7)
        if 2 * (int(h[_H_ITEMS]) + 1) > mask + 1 or end > int(h[_H_DATA_BYTES]):
            h[_H_FULL] = 1
            return False
        reserved = int(h[_H_RESERVED])
        if end > reserved:
            grow_to = min(max(end, reserved + _RESERVE_CHUNK), int(h[_H_DATA_BYTES]))
            if not self._seg.reserve(self._data_off + reserved, grow_to - reserved):
                h[_H_FULL] = 1  # the file system (/dev/shm) is full: stop, never SIGBUS
                return False
            h[_H_RESERVED] = grow_to
        start = self._data_off + fill
        buf = self._seg.buf
        buf[start : start + len(head)] = head
        buf[start + len(head) : start + length] = payload
        # Publish: offset and length first, then the digest that readers look for.
        slots[4 * i + 2], slots[4 * i + 3], slots[4 * i + 1] = fill, length, hi
        slots[4 * i] = lo
        h[_H_FILL] = end
        h[_H_ITEMS] += 1
        self._stats["put_bytes"] += length
        return True

    def stats(self) -> dict[str, int]:
        """This process's hits/misses/errors/puts plus the store's items, used and capacity bytes."""
        self._ensure()
        h = self._header
        return {
            **self._stats,
            "items": int(h[_H_ITEMS]),
            "used_bytes": int(h[_H_DATA_OFF] + h[_H_FILL]),
            "capacity_bytes": int(h[_H_SIZE]),
            "full": int(h[_H_FULL]),
        }

    def close(self) -> None:
        """Detach this process; the last live process removes the store."""
        if self._pid != os.getpid():
            return
        atexit.unregister(self.close)
        _lock(self._fd, self.path)
        try:
            pairs = self._header[_H_ATTACH : _H_ATTACH + 2 * _MAX_ATTACH].reshape(_MAX_ATTACH, 2)
            mine = np.flatnonzero(pairs[:, 0] == os.getpid())
            if mine.size:
                pairs[mine[0]] = 0  # one entry per handle: another handle in this process keeps its own
            if not _live_pids(self._header) and os.path.exists(self.path):
                os.unlink(self.path)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
        self._slots.release()
        self._slots = self._header = None
        self._seg.close()
        self._seg = None
        self._pid = -1

    def __getstate__(self) -> dict:
        return {k: getattr(self, k) for k in ("capacity_bytes", "name", "directory", "max_items", "verify")}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def __repr__(self) -> str:
        return f"LocalStore(capacity_bytes={self.capacity_bytes}, name={self.name!r}, directory={self.directory!r})"

"""A never-evicting table of byte values in shared memory: filled once, never overwritten, read without locks.

The one table under both the MinIO cache of raw items (:class:`coordl.fetch.minio.MinioCache`, keys are
item indices) and the sample cache (:class:`memcache.LocalStore`, keys are digests of string keys).
Values are appended until the budget or the index is used up, then puts stop; nothing is evicted or
overwritten, so a reader needs no lock and a view it got stays valid.

Layout, from ``base`` in a :class:`shmem.segment.Segment` (little-endian int64 words):

    header  64 words: magic, version, rows, data offset, data bytes, fill (bump pointer), items,
            value bytes, full flag, reserved bytes (data backed by ``posix_fallocate``), dense flag,
            stop-when-full flag
    rows    ``rows`` x 5 words: key_lo, key_hi, offset, length, check
    data    ``data bytes``: values back to back, 8-byte aligned

Keys are pairs of signed 64-bit ints ``(lo, hi)`` with ``lo != 0`` (0 marks an empty row). With
``dense=True`` key ``(k + 1, 0)`` lives in row ``k`` (item indices); otherwise ``(lo, hi)`` is a 128-bit
digest placed by linear probing at load factor <= 1/2.

**Publication, safe on any CPU.** A writer claims a row under an ``flock`` (offset, length, check 0,
then the key), copies the value without the lock, then stores ``check``: a CRC-32 over the key, the
length and the bytes, with bit 32 set so it is never 0. A reader serves a value only when the check it
reads matches the CRC of the bytes it reads. On x86 stores become visible in program order, but on a
weakly ordered CPU (aarch64: Grace-Hopper, Graviton) a reader may see the check before the bytes, or
the key before the offset: either way the CRC does not match and the read is a miss, never wrong bytes.
A writer killed mid-copy leaves check 0, which is never served. The CRC costs about 0.5 ms per MB
(zlib, ~2-3 GB/s here), less than copying the value once.

**Each row checked once.** A value is never overwritten, so a process that read a row intact (or wrote it)
skips the CRC at later reads of it. On x86-64 the first reader to find a row intact also sets bit 33 of its
check, and readers in every process then skip the CRC too: there stores become visible to every core in
the order they were made, so a reader that sees the mark sees the bytes the checker saw. That is what a
loader's workers need when they are new processes each epoch (torch's default, ``persistent_workers=False``):
without it every epoch's workers checked every hit again (30 us per 90 KB item here). On a weakly ordered
CPU a reader may see the mark before the bytes, so there the mark is neither set nor trusted: each process
checks each row once.

Space: pages are reserved with ``posix_fallocate`` before they are written, in chunks of
:data:`RESERVE_CHUNK_BYTES`, so a full ``/dev/shm`` stops puts (the table is marked full) instead of
killing a process with SIGBUS.
"""

from __future__ import annotations

import fcntl
import os
import platform
import zlib
from collections.abc import Sequence

import numpy as np

from shmem.forklock import ForkSafeLock
from shmem.segment import Segment

__all__ = ["AppendTable", "HEADER_BYTES", "ROW_BYTES", "RESERVE_CHUNK_BYTES", "table_bytes"]

_MAGIC = int.from_bytes(b"SHMTAB01", "little")
_VERSION = 1
HEADER_BYTES = 512
ROW_WORDS = 5
ROW_BYTES = ROW_WORDS * 8
RESERVE_CHUNK_BYTES = 8 << 20  # one fallocate per 8 MiB of values, not one per value
_ALIGN = 8
(_H_MAGIC, _H_VERSION, _H_ROWS, _H_DATA_OFF, _H_DATA_BYTES, _H_FILL, _H_ITEMS, _H_VALUE_BYTES, _H_FULL,
 _H_RESERVED, _H_DENSE, _H_STOP_WHEN_FULL) = range(12)  # fmt: skip
_CHECK_SET = 1 << 32  # a published check is never 0
_CHECKED_MARK = 1 << 33  # set in a check by the first reader that found the row intact (x86-64 only)
# Stores seen in program order by every core (TSO): a row's mark may be shared between processes.
_SHARED_MARKS = platform.machine().lower() in ("x86_64", "amd64")


def _rows_for(max_items: int, dense: bool) -> int:
    if dense:
        return max(1, int(max_items))
    return 1 << max(4, (2 * max(1, int(max_items)) - 1).bit_length())  # load factor <= 1/2


def table_bytes(max_items: int, data_bytes: int, *, dense: bool = False) -> int:
    """Bytes a table of ``max_items`` keys and ``data_bytes`` of values needs (header and rows included)."""
    return HEADER_BYTES + _rows_for(max_items, dense) * ROW_BYTES + int(data_bytes)


def _check(lo: int, hi: int, value: bytes | memoryview) -> int:
    seed = zlib.crc32(lo.to_bytes(8, "little", signed=True) + hi.to_bytes(8, "little", signed=True))
    seed = zlib.crc32(len(value).to_bytes(8, "little"), seed)
    return zlib.crc32(value, seed) | _CHECK_SET


class AppendTable:
    """A never-evicting key -> bytes table in ``segment`` from byte ``base`` on.

    Build the table once with :meth:`create` (the creating process), then every process opens the same
    region with :meth:`open` (or gets the table by pickling, which carries the segment's path).

    Args:
        segment: the shared segment holding the table (its lifetime is the caller's).
        base: byte offset of the table in the segment.
    """

    def __init__(self, segment: Segment, base: int = 0) -> None:
        self.segment = segment
        self.base = int(base)
        header = segment.array(np.int64, self.base, HEADER_BYTES // 8)
        if int(header[_H_MAGIC]) != _MAGIC or int(header[_H_VERSION]) != _VERSION:
            raise ValueError(f"{segment.path} at offset {self.base} holds no table (bad magic or version)")
        self._header = header
        self.rows = int(header[_H_ROWS])
        self.dense = bool(header[_H_DENSE])
        self.data_bytes = int(header[_H_DATA_BYTES])
        self._data_off = self.base + int(header[_H_DATA_OFF])
        rows_off = self.base + HEADER_BYTES
        self._row_words = segment.buf[rows_off : rows_off + self.rows * ROW_BYTES].cast("q")
        self._buf = segment.buf
        self._mask = self.rows - 1
        self._lock_fd: int | None = None
        self._lock_pid = -1
        self._thread_lock = ForkSafeLock()  # flock does not exclude threads sharing a descriptor
        self.torn_reads = 0  # this process's reads refused by the check (a concurrent or dead writer)
        # Rows whose bytes this process has checked (or written): a value is never overwritten, so one
        # check per process and row is enough, and later reads cost a copy, not a CRC. Between threads
        # the GIL orders memory; between processes only the CRC does, or on x86-64 the row's shared mark.
        self._checked: bytearray | None = None

    @classmethod
    def create(
        cls,
        segment: Segment,
        max_items: int,
        data_bytes: int,
        *,
        dense: bool = False,
        stop_when_full: bool = False,
        base: int = 0,
    ) -> AppendTable:
        """Lay out an empty table; the segment must have :func:`table_bytes` bytes from ``base``.

        The header and rows are reserved at once (they are written at random); values as they come.
        ``stop_when_full``: the first value that does not fit ends all puts (cheap rejections from then
        on); otherwise a smaller value may still fit after a larger one did not (first come, first kept).
        """
        rows = _rows_for(max_items, dense)
        data_off = HEADER_BYTES + rows * ROW_BYTES
        if base + data_off + data_bytes > segment.size:
            raise ValueError(
                f"{segment.path}: {segment.size} bytes cannot hold a table of {rows} rows and "
                f"{data_bytes} value bytes from offset {base}"
            )
        if not segment.reserve(base, data_off):
            raise OSError(f"no room for a table index of {data_off} bytes in {os.path.dirname(segment.path)}")
        header = segment.array(np.int64, base, HEADER_BYTES // 8)
        header[:] = 0
        header[[_H_ROWS, _H_DATA_OFF, _H_DATA_BYTES, _H_DENSE]] = rows, data_off, data_bytes, int(dense)
        header[_H_STOP_WHEN_FULL] = int(stop_when_full)
        header[_H_VERSION] = _VERSION
        header[_H_MAGIC] = _MAGIC  # last: a half-made header is never taken for a table
        return cls(segment, base)

    # -- reading: no lock ---------------------------------------------------------------------------

    def _find(self, lo: int, hi: int) -> int:
        """The row holding key ``(lo, hi)``, or ``-1 - row`` of the empty row where it would go."""
        words = self._row_words
        if self.dense:
            if not 0 <= lo - 1 < self.rows:
                raise KeyError(f"key {lo - 1} is outside the table's 0..{self.rows - 1}")
            row = lo - 1
            return row if words[ROW_WORDS * row] == lo else -1 - row
        row = lo & self._mask
        while True:
            at = ROW_WORDS * row
            stored = words[at]
            if stored == 0:
                return -1 - row
            if stored == lo and words[at + 1] == hi:
                return row
            row = (row + 1) & self._mask

    def get(self, lo: int, hi: int = 0, *, verify: bool = True) -> memoryview | None:
        """A read-only view of key ``(lo, hi)``'s value, or None when absent or not (yet) intact.

        ``verify=False`` skips the CRC over the bytes (a copy's speed). Safe only where stores become
        visible in program order (x86-64) and nothing else writes the segment. With ``verify`` a row is
        checked once per process: after this process has read it intact (or written it), later reads
        of it skip the CRC, since a value is never overwritten; on x86-64, once any process has (see the
        module's text).
        """
        row = self._find(lo, hi)
        if row < 0:
            return None
        at = ROW_WORDS * row
        words = self._row_words
        check = words[at + 4]
        if check == 0:
            return None  # claimed, being written (or its writer died)
        offset, length = words[at + 2], words[at + 3]
        if not 0 <= offset <= offset + length <= self.data_bytes:
            self.torn_reads += 1
            return None
        start = self._data_off + offset
        view = self._buf[start : start + length]
        if verify and not (self._checked is not None and self._checked[row]):
            if not (_SHARED_MARKS and check & _CHECKED_MARK):
                if _check(lo, hi, view) != check & ~_CHECKED_MARK:
                    self.torn_reads += 1
                    return None
                if _SHARED_MARKS:  # one aligned 8-byte store; readers racing here store the same value
                    words[at + 4] = check | _CHECKED_MARK
            self._mark_checked(row)
        return view.toreadonly()

    def _mark_checked(self, row: int) -> None:
        if self._checked is None:
            self._checked = bytearray(self.rows)  # 1 byte per row, made at this process's first read
        self._checked[row] = 1

    def __contains__(self, key: tuple[int, int]) -> bool:
        row = self._find(*key)
        return row >= 0 and self._row_words[ROW_WORDS * row + 4] != 0

    # -- writing: claim under the lock, copy without it, publish the check ----------------------------

    def put(self, lo: int, hi: int, parts: Sequence[bytes | bytearray | memoryview]) -> bool:
        """Store the concatenation of ``parts`` under ``(lo, hi)``. False when present, full or no room."""
        if lo == 0:
            raise ValueError("table keys need lo != 0 (0 marks an empty row)")
        length = sum(memoryview(p).nbytes for p in parts)
        h = self._header
        # Unlocked checks first: once the table is full, a put costs no lock.
        if h[_H_FULL] or (h[_H_FILL] + length > self.data_bytes and not h[_H_STOP_WHEN_FULL]):
            return False
        if self._find(lo, hi) >= 0:
            return False
        with self._locked():
            row, offset = self._claim(lo, hi, length)
        if row < 0:
            return False
        start = self._data_off + offset
        pos = start
        for part in parts:
            n = memoryview(part).nbytes
            self._buf[pos : pos + n] = memoryview(part).cast("B")
            pos += n
        # Publish: the check goes last. A reader that sees it before the bytes computes another CRC.
        self._row_words[ROW_WORDS * row + 4] = _check(lo, hi, self._buf[start : start + length])
        self._mark_checked(row)  # this process wrote the bytes it would check
        return True

    def _claim(self, lo: int, hi: int, length: int) -> tuple[int, int]:
        """Under the lock: ``(row, offset)`` for the value, or ``(-1, -1)`` (present, full, no room)."""
        h = self._header
        row = self._find(lo, hi)
        if row >= 0 or h[_H_FULL]:
            return -1, -1
        row = -1 - row
        fill = int(h[_H_FILL])
        end = fill + (length + _ALIGN - 1) // _ALIGN * _ALIGN
        if end > self.data_bytes:
            if h[_H_STOP_WHEN_FULL]:
                h[_H_FULL] = 1
            return -1, -1  # this value does not fit; a smaller one still may (first come, first kept)
        if not self.dense and 2 * (int(h[_H_ITEMS]) + 1) > self.rows:
            h[_H_FULL] = 1  # the index is at its load factor: no more keys
            return -1, -1
        if not self._reserve_to(end):
            h[_H_FULL] = 1  # the file system (/dev/shm) is full: stop, never SIGBUS
            return -1, -1
        at, words = ROW_WORDS * row, self._row_words
        words[at + 2], words[at + 3], words[at + 4], words[at + 1] = fill, length, 0, hi
        words[at] = lo
        h[_H_FILL] = end
        h[_H_ITEMS] += 1
        h[_H_VALUE_BYTES] += length
        return row, fill

    def _reserve_to(self, end: int) -> bool:
        h = self._header
        reserved = int(h[_H_RESERVED])
        if end <= reserved:
            return True
        grow_to = min(max(end, reserved + RESERVE_CHUNK_BYTES), self.data_bytes)
        if not self.segment.reserve(self._data_off + reserved, grow_to - reserved):
            # No room for a whole chunk: take just what this value needs, if the file system has it.
            if grow_to == end or not self.segment.reserve(self._data_off + reserved, end - reserved):
                return False
            grow_to = end
        h[_H_RESERVED] = grow_to
        return True

    def _locked(self) -> _FileLock:
        pid = os.getpid()
        if self._lock_pid != pid:
            # One descriptor per process: flock locks belong to the open file, so a descriptor inherited
            # across fork would be the parent's lock too. Several fetch threads of a new worker arrive
            # here at once: one opens it, and the pid is set last, so no thread takes a half-made pair.
            with self._thread_lock:
                if self._lock_pid != pid:
                    self._lock_fd = self.segment.reopen()
                    self._lock_pid = pid
        fd = self._lock_fd
        assert fd is not None  # set with the pid just checked
        return _FileLock(fd, self._thread_lock)

    # -- bookkeeping ------------------------------------------------------------------------------

    @property
    def full(self) -> bool:
        """True once the table takes no more rows (the file system or the index is full, or it stops when
        full). A value refused only for its size is not this: a smaller one may still fit."""
        return bool(self._header[_H_FULL])

    def stats(self) -> dict[str, int]:
        """``items``, ``value_bytes``, ``used_bytes`` (of the data area), ``data_bytes``, ``full``."""
        h = self._header
        return {
            "items": int(h[_H_ITEMS]),
            "value_bytes": int(h[_H_VALUE_BYTES]),
            "used_bytes": int(h[_H_FILL]),
            "data_bytes": self.data_bytes,
            "full": int(h[_H_FULL]),
        }

    def close(self) -> None:
        """Drop this process's views and lock descriptor (the segment is the caller's to close)."""
        if self._lock_fd is not None and self._lock_pid == os.getpid():
            os.close(self._lock_fd)
        self._lock_fd, self._lock_pid = None, -1
        # Drop the views before the caller unmaps (empty ones: a use after close fails on its index).
        self._row_words.release()
        self._row_words, self._buf = memoryview(b"").cast("q"), memoryview(b"")
        self._header = np.empty(0, np.int64)

    def __getstate__(self) -> dict:
        return {"segment": self.segment, "base": self.base}

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, state["segment"], state["base"])


class _FileLock:
    """``with`` block holding a thread lock and an exclusive flock on an open descriptor."""

    def __init__(self, fd: int, thread_lock: ForkSafeLock) -> None:
        self._fd = fd
        self._thread_lock = thread_lock

    def __enter__(self) -> None:
        self._thread_lock.acquire()
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._thread_lock.release()

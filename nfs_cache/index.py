"""The manifest's index: one file every process of the node maps, so staged entries cost no memory per process.

Each process used to read the manifest log into a table of its own. In the epoch that stages a dataset, every
DataLoader worker read every record the others appended (27-37 MB per worker at 10^5 files), and a restart
looked every staged name up again one by one. Now the entries live in ``DST/.coordl/index.bin``, an open
addressing hash table that every process maps (``MAP_SHARED``): a record appended to the log is parsed once on
the node, by whichever process next catches up, and a worker's private memory does not grow with the files.

Layout (little-endian int64 words): a header of :data:`HEADER_WORDS` words, then ``slots`` x 5 words
``key_lo, key_hi, size, mtime_ns, meta``. The key is a 128-bit BLAKE2b digest of the relative path (0 marks
an empty slot; keys are never removed, a removed file's slot is kept not live). ``meta`` holds the CRC32 of
the file, a live bit, a published bit and a check over the slot's words.

**Writers** (catching up with the log, growing the table) hold ``locks/index`` (``flock``, released by the
kernel if the holder dies). A catch-up marks the header dirty, applies the new complete lines, then stores
how far it parsed; a process killed in between leaves the mark, and the next writer applies those lines again
(idempotent: last record wins) and recounts. **Readers** take no lock: a slot whose check does not match what
they read (being written, or seen out of order on a weakly ordered CPU) is read again under the lock.

**Trust across restarts.** The header names the boot (``/proc/sys/kernel/random/boot_id``), the manifest's
device and inode, how far it parsed and the 8 bytes the log held just before that point. Within one boot,
what processes wrote into the mapping is in the page cache whatever killed them; after a reboot (whose
crash may have lost pages of either file) or any mismatch, the index is built again from the log, which stays
the record. Growing or rebuilding writes a new file (``.coordl/tmp/<pid>.<thread>.index``, renamed over
``index.bin``) and marks the old one moved, so a process mapping it opens the new one.

When the stage disk has no room for the index (or its file system cannot reserve blocks), a process keeps it in
its own memory (as before: each process reads the log); staging goes on.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import mmap
import os
import threading
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from nfs_cache.indexslots import Slots, entry_keys, name_key

__all__ = ["StagedIndex", "HEADER_WORDS", "SLOT_BYTES"]

HEADER_WORDS = 16
SLOT_WORDS = 5
SLOT_BYTES = SLOT_WORDS * 8
_MAGIC = int.from_bytes(b"CDLIDX01", "little")
_VERSION = 1
(_MAGIC_W, _VERSION_W, _SLOTS_W, _PARSED_W, _TAIL_W, _DEV_W, _INO_W, _BOOT_LO_W, _BOOT_HI_W, _MOVED_W,
 _DIRTY_W, _USED_W, _LIVE_W, _LIVE_BYTES_W) = range(14)  # fmt: skip
# A shared file that cannot be reserved: no space, or a file system without fallocate (a sparse mapping would
# SIGBUS on a full disk).
_NO_SHARED_FILE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EOPNOTSUPP, errno.EINVAL)
_READ_CHUNK_BYTES = 1 << 20  # a catch-up reads the log in pieces: its memory stays flat (~5 MB of parsing)


def _boot_id() -> tuple[int, int]:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            digest = hashlib.blake2b(f.read().strip().encode(), digest_size=16).digest()
    except OSError:
        import psutil

        digest = hashlib.blake2b(str(int(psutil.boot_time())).encode(), digest_size=16).digest()
    lo, hi = np.frombuffer(digest, dtype="<i8").tolist()
    return int(lo), int(hi)


class StagedIndex:
    """The shared index of the manifest log at ``manifest_path`` (the file is ``index.bin`` beside it);
    ``parse`` reads complete log lines into (names, rows of size/mtime_ns/crc32, live flags)."""

    def __init__(
        self, manifest_path: str, parse: Callable[[bytes], tuple[list[str], np.ndarray, np.ndarray]]
    ) -> None:
        self._parse = parse
        meta = os.path.dirname(os.path.abspath(manifest_path))
        self.path = os.path.join(meta, "index.bin")
        self._lock_path = os.path.join(meta, "locks", "index")
        self._tmp_dir = os.path.join(meta, "tmp")
        self._thread_lock = threading.Lock()
        self._pid = -1
        self._lock_fd = -1
        self._slots: Slots | None = None
        self._header: memoryview | None = None
        self.private = False  # True: this process's own copy (no room on the stage disk for the shared file)

    # -- the mapping -------------------------------------------------------------------------------------------------

    def _fresh_process(self) -> None:
        # After a fork: a lock of our own (an inherited fd would share the parent's flock).
        if self._pid != os.getpid():
            self._thread_lock = threading.Lock()
            os.makedirs(os.path.dirname(self._lock_path), exist_ok=True)
            self._lock_fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            self._pid = os.getpid()

    @contextlib.contextmanager
    def locked(self, manifest_fd: int) -> Iterator[Slots]:
        """The slots, writers excluded (this process's threads and every other process), mapped and current."""
        self._fresh_process()
        with self._thread_lock:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                if self._header is None or self._header[_MOVED_W]:
                    self._open(manifest_fd)
                assert self._slots is not None and self._header is not None
                if self._header[_DIRTY_W]:  # a writer died mid-catch-up: apply its lines again, then recount
                    self._catch_up(manifest_fd)
                    self._recount()
                yield self._slots
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _open(self, manifest_fd: int) -> None:
        """Map ``index.bin`` if it describes this manifest in this boot, else build it again from the log."""
        if not self.private:
            with contextlib.suppress(FileNotFoundError, ValueError, OSError):
                fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
                try:
                    self._map(mmap.mmap(fd, 0))
                finally:
                    os.close(fd)
                if self._valid(manifest_fd):
                    return
        self._build(manifest_fd, Slots.slots_for(0), None)

    def _map(self, mm: mmap.mmap) -> None:
        words = memoryview(mm).cast("q")
        if len(words) < HEADER_WORDS or words[_MAGIC_W] != _MAGIC or words[_VERSION_W] != _VERSION:
            raise ValueError(f"{self.path}: not an index of this version")
        slots = words[_SLOTS_W]
        if slots <= 0 or len(words) != HEADER_WORDS + slots * SLOT_WORDS:
            raise ValueError(f"{self.path}: {len(words)} words for {slots} slots")
        self._header = words[:HEADER_WORDS]
        self._slots = Slots(mm, words, HEADER_WORDS, slots)

    def _valid(self, manifest_fd: int) -> bool:
        h = self._header
        assert h is not None
        st = os.fstat(manifest_fd)
        parsed = h[_PARSED_W]
        return (
            (h[_BOOT_LO_W], h[_BOOT_HI_W]) == _boot_id()
            and (h[_DEV_W], h[_INO_W]) == (st.st_dev, st.st_ino)
            and 0 <= parsed <= st.st_size
            and h[_TAIL_W] == _tail(manifest_fd, parsed)
            and not h[_MOVED_W]
        )

    def _build(self, manifest_fd: int, slots: int, old: Slots | None) -> None:
        """A new table of ``slots`` slots with ``old``'s entries (None: empty, the log parsed from its start)."""
        size = (HEADER_WORDS + slots * SLOT_WORDS) * 8
        mm = None
        tmp = os.path.join(self._tmp_dir, f"{os.getpid()}.{threading.get_ident()}.index")
        if not self.private:
            try:
                os.makedirs(self._tmp_dir, exist_ok=True)
                fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
                try:
                    os.posix_fallocate(fd, 0, size)  # reserved now: a full disk is an error, not SIGBUS
                    mm = mmap.mmap(fd, size)
                finally:
                    os.close(fd)
            except OSError as e:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                if e.errno not in _NO_SHARED_FILE:
                    raise
                self.private = True  # no room for the shared file: this process keeps its own
        if mm is None:
            mm = mmap.mmap(-1, size)
        words = memoryview(mm).cast("q")
        st = os.fstat(manifest_fd)
        words[_MAGIC_W], words[_VERSION_W], words[_SLOTS_W] = _MAGIC, _VERSION, slots
        words[_DEV_W], words[_INO_W] = st.st_dev, st.st_ino
        words[_BOOT_LO_W], words[_BOOT_HI_W] = _boot_id()
        previous = self._header
        self._header = words[:HEADER_WORDS]
        self._slots = Slots(mm, words, HEADER_WORDS, slots)
        if old is not None and previous is not None:
            self._slots.copy_from(old)
            words[_PARSED_W], words[_TAIL_W] = previous[_PARSED_W], previous[_TAIL_W]
        self._recount()
        if not self.private:
            os.replace(tmp, self.path)
            if previous is not None:
                previous[_MOVED_W] = 1  # processes that map the old file open the new one
        if old is None:
            self._catch_up(manifest_fd)

    def _recount(self) -> None:
        h = self._header
        assert h is not None and self._slots is not None
        h[_USED_W], h[_LIVE_W], h[_LIVE_BYTES_W] = self._slots.totals()
        h[_DIRTY_W] = 0

    # -- writers -----------------------------------------------------------------------------------------------------

    def catch_up(self, manifest_fd: int) -> None:
        """Apply the log's complete lines not yet in the index (appended by any process)."""
        h = self._header
        if (
            h is not None
            and not h[_MOVED_W]
            and not h[_DIRTY_W]
            and h[_PARSED_W] >= os.fstat(manifest_fd).st_size
        ):
            return  # nothing new: no lock taken
        with self.locked(manifest_fd):
            self._catch_up(manifest_fd)

    def _catch_up(self, manifest_fd: int) -> None:
        h = self._header
        assert h is not None
        size = os.fstat(manifest_fd).st_size
        while h[_PARSED_W] < size:
            start = h[_PARSED_W]
            data = os.pread(manifest_fd, min(_READ_CHUNK_BYTES, size - start), start)
            end = data.rfind(b"\n") + 1
            if not end:
                if len(data) < _READ_CHUNK_BYTES:
                    return  # an incomplete last line is being written (or was torn): skip it for now
                end = len(data)  # a line longer than a chunk (1 MiB) is damage: skip it whole
            names, rows, live = self._parse(data[:end])
            self.reserve(h[_USED_W] + len(names), manifest_fd, locked=True)
            h = self._header  # reserve may have moved to a bigger table
            assert h is not None and self._slots is not None
            h[_DIRTY_W] = 1
            added, live_delta, bytes_delta = self._slots.apply(entry_keys(names), rows, live)
            h[_USED_W] += added
            h[_LIVE_W] += live_delta
            h[_LIVE_BYTES_W] += bytes_delta
            h[_PARSED_W], h[_TAIL_W] = start + end, _tail(manifest_fd, start + end)
            h[_DIRTY_W] = 0

    def reserve(self, keys: int, manifest_fd: int, *, locked: bool = False) -> None:
        """Grow the table now, if needed, so that ``keys`` names in all fit (e.g. a listing's)."""
        if not locked:
            with self.locked(manifest_fd):
                self.reserve(keys, manifest_fd, locked=True)
            return
        slots, h = self._slots, self._header
        assert slots is not None and h is not None
        want = Slots.slots_for(max(keys, h[_USED_W]))
        if want > slots.count:  # at least twice the slots: growing one catch-up at a time stays O(1) per key
            self._build(manifest_fd, max(want, 2 * slots.count), slots)

    # -- readers -----------------------------------------------------------------------------------------------------

    def get(self, relpath: str, manifest_fd: int) -> tuple[int, int, int] | None:
        """``(size, mtime_ns, crc32)`` of ``relpath`` as far as the index has parsed, or None (not staged)."""
        h = self._header
        if h is None or h[_MOVED_W]:
            with self.locked(manifest_fd):
                pass
            h = self._header
        assert self._slots is not None
        found = self._slots.get(name_key(relpath))
        if found is not False:
            return found
        with self.locked(manifest_fd) as slots:  # a slot being written: read it with writers excluded
            found = slots.get(name_key(relpath))
            return None if found is False else found

    def lookup(self, relpaths: Sequence[str], manifest_fd: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each of ``relpaths`` at once: (staged now, size, mtime_ns); sizes and mtimes 0 where not staged."""
        with self.locked(manifest_fd) as slots:
            return slots.lookup(entry_keys(relpaths))

    def totals(self, manifest_fd: int) -> tuple[int, int]:
        """(staged files, their bytes)."""
        h = self._header
        if h is None or h[_MOVED_W]:
            with self.locked(manifest_fd):
                pass
            h = self._header
        assert h is not None
        return int(h[_LIVE_W]), int(h[_LIVE_BYTES_W])

    def close(self) -> None:
        if self._lock_fd >= 0 and self._pid == os.getpid():
            os.close(self._lock_fd)
        self._lock_fd, self._pid = -1, -1
        self._header = self._slots = None  # unmapped once the last view is gone


def _tail(fd: int, offset: int) -> int:
    """The 8 bytes of the log just before ``offset`` as an int (0 before 8 bytes): a rewritten log differs."""
    if offset < 8:
        return 0
    return int.from_bytes(os.pread(fd, 8, offset - 8), "little", signed=True)

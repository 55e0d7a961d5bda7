"""The record of what is staged: an append-only log shared by every process on the node.

Why a log: a record is appended (``O_APPEND``, one ``write`` under an exclusive ``flock``) only *after* the staged
file has been renamed into place, so whatever a ``kill -9`` interrupts, the manifest never names a partial file.
Each line carries its own CRC, so a torn last line (crash in mid-write, disk full) is recognised and ignored.
Readers keep an offset and parse only what other processes appended since, so staying current costs one
``fstat`` per miss.

Line format (text, one record per line, last record for a path wins)::

    <crc32 of the rest, 8 hex> + <size> <mtime_ns> <crc32 of the file, 8 hex> <percent-encoded relpath>
    <crc32 of the rest, 8 hex> - <percent-encoded relpath>          (removed: failed verification)
"""

from __future__ import annotations

import fcntl
import os
import threading
import urllib.parse
import zlib

import numpy as np

from nfs_cache.entries import Entry, StagedEntries

__all__ = ["Entry", "Manifest"]


def _encode(body: str) -> bytes:
    return f"{zlib.crc32(body.encode()):08x} {body}\n".encode()


def _fields(line: bytes) -> tuple[bool, str, int, int, int] | None:
    """(added, relpath, size, mtime_ns, crc32) of one complete line (zeros for a removal), or None when damaged."""
    try:
        text = line.decode()
        crc_hex, body = text.split(" ", 1)
        if int(crc_hex, 16) != zlib.crc32(body.encode()):
            return None
        fields = body.split(" ")
        if fields[0] == "+" and len(fields) == 5:
            return True, urllib.parse.unquote(fields[4]), int(fields[1]), int(fields[2]), int(fields[3], 16)
        if fields[0] == "-" and len(fields) == 2:
            return False, urllib.parse.unquote(fields[1]), 0, 0, 0
    except (ValueError, UnicodeDecodeError):
        pass
    return None


def _decode(line: bytes) -> tuple[str, str, Entry | None] | None:
    """(op, relpath, entry) of one complete line, or None when it is damaged."""
    rec = _fields(line)
    if rec is None:
        return None
    added, relpath, size, mtime_ns, crc32 = rec
    return ("+", relpath, Entry(size, mtime_ns, crc32)) if added else ("-", relpath, None)


class Manifest:
    """In-memory view of the manifest log at ``path``; ``refresh`` picks up other processes' appends."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.entries = StagedEntries()  # held flat: see nfs_cache.entries
        self._offset = 0
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._fd = -1

    def _file(self) -> int:
        if self._fd < 0 or self._pid != os.getpid():
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            self._pid = os.getpid()
        return self._fd

    def refresh(self) -> None:
        """Apply the lines appended since the last refresh (by any process)."""
        with self._lock:
            fd = self._file()
            size = os.fstat(fd).st_size
            if size <= self._offset:
                return
            data = os.pread(fd, size - self._offset, self._offset)
            end = (
                data.rfind(b"\n") + 1
            )  # an incomplete last line is being written (or was torn): skip it for now
            names: list[str] = []
            numbers: list[int] = []  # size, mtime_ns, crc32, added of each record: no object per record
            for line in data[:end].split(b"\n")[:-1]:
                rec = _fields(line)
                if rec is not None:
                    names.append(rec[1])
                    numbers.extend(rec[2:])
                    numbers.append(int(rec[0]))
            table = np.array(numbers, dtype=np.int64).reshape(-1, 4)
            self.entries.apply_rows(names, table[:, :3], table[:, 3].astype(bool))
            # A torn last line (crash mid-write) stays unparsed here: the next append starts on a fresh line.
            self._offset += end
            self.entries.settle()

    @property
    def total_bytes(self) -> int:
        """Bytes of every staged file."""
        return self.entries.total_bytes

    def _append(self, body: str) -> None:
        fd = self._file()
        line = _encode(body)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            tail = os.fstat(fd).st_size
            # After a torn line, start on a fresh line so this record stays parseable.
            if tail and os.pread(fd, 1, tail - 1) != b"\n":
                line = b"\n" + line
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(28, f"short write to manifest {self.path}")
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def add(self, relpath: str, entry: Entry) -> None:
        """Record a staged file (call only after it was renamed into place)."""
        self._append(f"+ {entry.size} {entry.mtime_ns} {entry.crc32:08x} {urllib.parse.quote(relpath)}")
        self.refresh()

    def remove(self, relpath: str) -> None:
        """Forget a staged file (it failed verification or vanished)."""
        self._append(f"- {urllib.parse.quote(relpath)}")
        self.refresh()

    def get(self, relpath: str) -> Entry | None:
        return self.entries.get(relpath)

    def close(self) -> None:
        if self._fd >= 0 and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = -1

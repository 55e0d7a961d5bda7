"""The record of what is staged: an append-only log shared by every process on the node.

Why a log: a record is appended (``O_APPEND``, one ``write`` under an exclusive ``flock``) only *after* the staged
file has been renamed into place, so whatever a ``kill -9`` interrupts, the manifest never names a partial file.
Each line carries its own CRC, so a torn last line (crash in mid-write, disk full) is recognised and ignored.
The entries are read from an index every process of the node maps (:mod:`nfs_cache.index`): a line is
parsed once on the node, and staying current costs one ``fstat`` per miss.

Line format (text, one record per line, last record for a path wins)::

    <crc32 of the rest, 8 hex> + <size> <mtime_ns> <crc32 of the file, 8 hex> <percent-encoded relpath>
    <crc32 of the rest, 8 hex> - <percent-encoded relpath>          (removed: failed verification)
"""

from __future__ import annotations

import fcntl
import os
import urllib.parse
import zlib
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from nfs_cache.entries import Entry
from nfs_cache.index import StagedIndex

__all__ = ["Entry", "Manifest", "StagedEntries", "parse_lines"]


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


def parse_lines(data: bytes) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The records of complete lines ``data``: (relpaths, rows of size/mtime_ns/crc32, added flags); damaged
    lines (a torn append, a bad CRC) are left out. Lists of str and int only: no object per record."""
    names: list[str] = []
    numbers: list[int] = []
    for line in data.split(b"\n"):
        rec = _fields(line) if line else None
        if rec is not None:
            names.append(rec[1])
            numbers.extend(rec[2:])
            numbers.append(int(rec[0]))
    table = np.array(numbers, dtype=np.int64).reshape(-1, 4)
    return names, table[:, :3], table[:, 3].astype(bool)


class StagedEntries(Mapping[str, Entry]):
    """``relpath -> Entry`` of the files staged now, read from the shared index (``Manifest.entries``)."""

    def __init__(self, manifest: Manifest) -> None:
        self._manifest = manifest

    def get(self, relpath: str, default: Entry | None = None) -> Entry | None:  # type: ignore[override]
        found = self._manifest.get(relpath) if isinstance(relpath, str) else None
        return default if found is None else found

    def __getitem__(self, relpath: str) -> Entry:
        found = self.get(relpath)
        if found is None:
            raise KeyError(relpath)
        return found

    def __contains__(self, relpath: object) -> bool:
        return isinstance(relpath, str) and self._manifest.get(relpath) is not None

    def __len__(self) -> int:
        return self._manifest.totals()[0]

    def __iter__(self) -> Iterator[str]:
        """The staged paths, read from the log (a pass over it: for checks and tools, not per item)."""
        last: dict[str, bool] = {}
        for names, _, live in self._manifest.read_log():
            last.update(zip(names, live.tolist(), strict=True))
        return iter([name for name, alive in last.items() if alive and name in self])


class Manifest:
    """The manifest log at ``path`` and its shared index (:mod:`nfs_cache.index`): every process of the node
    reads the same entries; ``refresh`` applies what any process appended since the index last caught up."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.index = StagedIndex(path, parse_lines)
        self.entries = StagedEntries(self)
        self._pid = os.getpid()
        self._fd = -1

    def _file(self) -> int:
        if self._fd < 0 or self._pid != os.getpid():
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            self._pid = os.getpid()
        return self._fd

    def refresh(self) -> None:
        """Bring the index up to the log's last complete line (lines by any process; each parsed once)."""
        self.index.catch_up(self._file())

    def reserve(self, files: int) -> None:
        """Size the index for ``files`` names now (a listing's), not while workers stage them."""
        self.index.reserve(files, self._file())

    @property
    def total_bytes(self) -> int:
        """Bytes of every staged file."""
        return self.totals()[1]

    def totals(self) -> tuple[int, int]:
        """(staged files, their bytes)."""
        return self.index.totals(self._file())

    def lookup(self, relpaths: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For every one of ``relpaths`` in one pass: (staged now, its size, the mtime_ns it was staged with),
        sizes and mtimes 0 where not staged. Costs the same per name at any count (vectorised probes)."""
        self.refresh()
        return self.index.lookup(relpaths, self._file())

    def read_log(self) -> Iterator[tuple[list[str], np.ndarray, np.ndarray]]:
        """The log's records in order, parsed a few MB at a time (what :func:`parse_lines` gives)."""
        fd, offset = self._file(), 0
        while True:
            data = os.pread(fd, 4 << 20, offset)
            end = data.rfind(b"\n") + 1
            if not end:
                return
            yield parse_lines(data[:end])
            offset += end

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
        """The record of ``relpath`` as far as the index has caught up (``refresh`` first to see the latest)."""
        found = self.index.get(relpath, self._file())
        return None if found is None else Entry(*found)

    def close(self) -> None:
        if self._fd >= 0 and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = -1
        self.index.close()

"""The manifest's entries (``relpath -> Entry``) held flat, so a million staged files cost no per-file objects.

A stage directory of 10^6 files used to be read into a dict of 10^6 ``Entry`` objects in every process: ~300
bytes per file, parsed again by every spawned worker, and in forked workers each read of an entry wrote its
reference count and copied its page (pytorch/pytorch#13246). :class:`StagedEntries` keeps the bulk sorted in
flat arrays (names in a :class:`shmem.strings.StringArray`, size, mtime and CRC32 in one int64 array), found by
binary search, and only the records applied since the last compaction in a dict. :meth:`StagedEntries.settle`
(called by the manifest after each refresh) merges that dict into the arrays once it holds more than an eighth of
them: amortised O(1) passes per record, and a first read of a large manifest is merged once.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from shmem.strings import StringArray

__all__ = ["Entry", "StagedEntries"]

_MIN_DELTA = 4096  # records kept in the dict before a compaction is worth its pass over the arrays


@dataclass(frozen=True)
class Entry:
    """A staged file: its size, the source's mtime when it was copied, and the CRC32 of its bytes."""

    size: int
    mtime_ns: int
    crc32: int


class StagedEntries(Mapping[str, Entry]):
    """``relpath -> Entry`` for the files staged now: a read-only mapping to its users, changed by :meth:`apply`."""

    def __init__(self) -> None:
        self._names = StringArray()
        self._values = np.zeros((0, 3), dtype=np.int64)  # size, mtime_ns, crc32 of each name
        self._delta: dict[str, Entry | None] = {}  # since the last compaction; None: removed
        self._count = 0
        self.total_bytes = 0

    def _base(self, relpath: str) -> Entry | None:
        names = self._names
        i = bisect.bisect_left(names, relpath)
        if i < len(names) and names[i] == relpath:
            size, mtime_ns, crc32 = self._values[i].tolist()
            return Entry(size, mtime_ns, crc32)
        return None

    def get(self, relpath: str, default: Entry | None = None) -> Entry | None:  # type: ignore[override]
        if not isinstance(relpath, str):  # as a dict of str keys answers
            return default
        if relpath in self._delta:
            found = self._delta[relpath]
        else:
            found = self._base(relpath)
        return default if found is None else found

    def __getitem__(self, relpath: str) -> Entry:
        found = self.get(relpath)
        if found is None:
            raise KeyError(relpath)
        return found

    def __contains__(self, relpath: object) -> bool:
        return isinstance(relpath, str) and self.get(relpath) is not None

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[str]:
        delta = self._delta
        for name in self._names:
            if name not in delta:
                yield name
        yield from [name for name, entry in delta.items() if entry is not None]

    def apply(self, relpath: str, entry: Entry | None) -> None:
        """Record ``relpath`` as staged with ``entry``, or (None) as not staged."""
        old = self.get(relpath)
        if old is not None:
            self.total_bytes -= old.size
            self._count -= 1
        if entry is not None:
            self.total_bytes += entry.size
            self._count += 1
        self._delta[relpath] = entry

    def settle(self) -> None:
        """Compact when the records since the last compaction outgrow an eighth of the arrays."""
        if len(self._delta) > max(_MIN_DELTA, len(self._names) // 8):
            self.compact()

    def compact(self) -> None:
        """Merge the records since the last compaction into the sorted arrays."""
        if not self._delta:
            return
        delta, names = self._delta, list(self._names)
        keep = np.fromiter((n not in delta for n in names), dtype=bool, count=len(names))
        added = sorted((n, e) for n, e in delta.items() if e is not None)
        merged = [n for n, k in zip(names, keep.tolist(), strict=True) if k] + [n for n, _ in added]
        new = np.array([(e.size, e.mtime_ns, e.crc32) for _, e in added], dtype=np.int64).reshape(-1, 3)
        values = np.concatenate([self._values[keep], new])
        order = sorted(range(len(merged)), key=merged.__getitem__)  # two sorted runs: timsort merges them
        self._names = StringArray(merged[i] for i in order)
        self._values = values[np.array(order, dtype=np.int64)] if order else values
        self._delta = {}

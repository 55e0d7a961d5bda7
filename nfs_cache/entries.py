"""The manifest's entries (``relpath -> Entry``) held flat, so a million staged files cost no per-file objects.

A stage directory of 10^6 files used to be read into a dict of 10^6 ``Entry`` objects in every process: ~300
bytes per file, parsed again by every spawned worker, and in forked workers each read of an entry wrote its
reference count and copied its page (pytorch/pytorch#13246). :class:`StagedEntries` keeps the bulk in flat
arrays (names in a :class:`shmem.strings.StringArray`, size, mtime and CRC32 in one int64 array) ordered by the
names' hashes and found by a binary search over them, and only the records applied since the last compaction in
a dict. The hashes are Python's ``hash(str)``, which differs between processes: a pickled ``StagedEntries``
computes them again where it is unpickled. :meth:`StagedEntries.settle`
(called by the manifest after each refresh) merges that dict into the arrays once it holds more than an eighth of
them: amortised O(1) passes per record, and a first read of a large manifest is merged once.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

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
        self._set(StringArray(), np.zeros((0, 3), dtype=np.int64))
        self._delta: dict[str, Entry | None] = {}  # since the last compaction; None: removed
        self._count = 0
        self.total_bytes = 0

    def _set(self, names: StringArray, values: np.ndarray, hashes: np.ndarray | None = None) -> None:
        """The arrays: ``names`` in the order of their hashes, ``values[i]`` = size, mtime_ns, crc32 of name ``i``."""
        self._names, self._values = names, values
        if hashes is None:
            hashes = np.fromiter((hash(n) for n in names), dtype=np.int64, count=len(names))
        self._hashes = hashes
        self._hash_at = self._hashes.data  # bisect over a memoryview: Python ints, no NumPy scalar per probe

    def __reduce__(self) -> tuple[Any, ...]:
        self.compact()
        return (_rebuilt, (self._names, self._values))

    def _base(self, relpath: str) -> Entry | None:
        h, at, names = hash(relpath), self._hash_at, self._names
        i = bisect.bisect_left(at, h)
        while i < len(at) and at[i] == h:  # equal hashes sit together: compare their names
            if names[i] == relpath:
                size, mtime_ns, crc32 = self._values[i].tolist()
                return Entry(size, mtime_ns, crc32)
            i += 1
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
        delta = self._delta
        old = delta[relpath] if relpath in delta else self._base(relpath) if len(self._hashes) else None
        if old is not None:
            self.total_bytes -= old.size
            self._count -= 1
        if entry is not None:
            self.total_bytes += entry.size
            self._count += 1
        delta[relpath] = entry

    def settle(self) -> None:
        """Compact when the records since the last compaction outgrow an eighth of the arrays."""
        if len(self._delta) > max(_MIN_DELTA, len(self._names) // 8):
            self.compact()

    def apply_rows(self, names: list[str], rows: np.ndarray, live: np.ndarray) -> None:
        """:meth:`apply` for each of ``names`` in order (the last record of a name wins): ``rows[i]`` is size,
        mtime_ns, crc32 where ``live[i]``, else the name was removed. A long run is merged into the arrays at
        once, without an ``Entry`` per record."""
        if len(names) <= _MIN_DELTA:
            for name, row, alive in zip(names, rows.tolist(), live.tolist(), strict=True):
                self.apply(name, Entry(*row) if alive else None)
            return
        self.compact()
        last = {name: i for i, name in enumerate(names)}
        pick = np.fromiter(last.values(), dtype=np.int64, count=len(last))
        alive = live[pick]
        self._merge_base(last, [n for n, a in zip(last, alive.tolist(), strict=True) if a], rows[pick[alive]])

    def compact(self) -> None:
        """Merge the records since the last compaction into the arrays."""
        if not self._delta:
            return
        delta = self._delta
        # Lists of str and int only: a million tuples would wake the cyclic collector over and over.
        live = [n for n, e in delta.items() if e is not None]
        new = np.empty((len(live), 3), dtype=np.int64)
        for column, field in enumerate(("size", "mtime_ns", "crc32")):
            new[:, column] = [getattr(delta[n], field) for n in live]
        self._merge_base(delta, live, new)

    def _merge_base(self, replaced: Mapping[str, object], names: list[str], rows: np.ndarray) -> None:
        """The arrays without the names in ``replaced``, plus ``names`` with ``rows``; nothing left in the dict."""
        base = list(self._names)
        keep = np.fromiter((n not in replaced for n in base), dtype=bool, count=len(base))
        merged = [n for n, k in zip(base, keep.tolist(), strict=True) if k] + names
        values = np.concatenate([self._values[keep], rows.reshape(-1, 3)])
        hashes = np.fromiter((hash(n) for n in merged), dtype=np.int64, count=len(merged))
        order = np.argsort(hashes, kind="stable")
        self._set(StringArray([merged[i] for i in order.tolist()]), values[order], hashes[order])
        self._delta = {}
        self._count, self.total_bytes = len(merged), int(values[:, 0].sum())


def _rebuilt(names: StringArray, values: np.ndarray) -> StagedEntries:
    out = StagedEntries()
    out._set(names, values)
    out._count, out.total_bytes = len(names), int(values[:, 0].sum())
    return out

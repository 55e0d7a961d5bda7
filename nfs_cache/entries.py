"""A stage's listing (``relpath -> RemoteFile``) held flat, so a million files cost no per-file objects; and
``Entry``, a staged file's record.

A forked worker that reads a Python object writes its reference count and copies its page
(pytorch/pytorch#13246), so a dict of 10^6 records is copied into every worker that reads it. :class:`FlatRecords`
keeps the bulk in flat arrays (names in a :class:`shmem.strings.StringArray`, the fields in one int64 array)
ordered by the names' hashes and found by a binary search over them, and only the records applied since the
last compaction in a dict. The hashes are Python's ``hash(str)``, which differs between processes: a pickled
``FlatRecords`` computes them again where it is unpickled. :meth:`FlatRecords.settle` merges that dict into the
arrays once it holds more than an eighth of them: amortised O(1) passes per record. :class:`RemoteFiles` is
``StagedSource``'s listing, read by each worker as it stages a file. (The manifest's entries are in an index all
processes map: :mod:`nfs_cache.index`.)
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from nfs_cache.sources import RemoteFile
from shmem.strings import StringArray

__all__ = ["Entry", "FlatRecords", "RemoteFiles"]

V = TypeVar("V")

_MIN_DELTA = 4096  # records kept in the dict before a compaction is worth its pass over the arrays


@dataclass(frozen=True)
class Entry:
    """A staged file: its size, the source's mtime when it was copied, and the CRC32 of its bytes."""

    size: int
    mtime_ns: int
    crc32: int


class FlatRecords(Mapping[str, V], Generic[V]):
    """``name -> record`` whose records are rows of ints (:attr:`FIELDS`, the first a size in bytes): a read-only
    mapping to its users, changed by :meth:`apply`, :meth:`apply_rows` and :meth:`update`."""

    FIELDS: tuple[str, ...] = ()

    def _record(self, name: str, row: list[int]) -> V:
        raise NotImplementedError

    def __init__(self) -> None:
        self._set(StringArray(), np.zeros((0, len(self.FIELDS)), dtype=np.int64))
        self._delta: dict[str, V | None] = {}  # since the last compaction; None: removed
        self._count = 0
        self.total_bytes = 0  # the sum of the first field

    def _set(self, names: StringArray, values: np.ndarray, hashes: np.ndarray | None = None) -> None:
        """The arrays: ``names`` in the order of their hashes, ``values[i]`` the fields of name ``i``."""
        self._names, self._values = names, values
        if hashes is None:
            hashes = np.fromiter((hash(n) for n in names), dtype=np.int64, count=len(names))
        self._hashes = hashes
        self._hash_at = self._hashes.data  # bisect over a memoryview: Python ints, no NumPy scalar per probe

    def __reduce__(self) -> tuple[Any, ...]:
        self.compact()
        return (_rebuilt, (type(self), self._names, self._values))

    def _base(self, name: str) -> V | None:
        h, at, names = hash(name), self._hash_at, self._names
        i = bisect.bisect_left(at, h)
        while i < len(at) and at[i] == h:  # equal hashes sit together: compare their names
            if names[i] == name:
                return self._record(name, self._values[i].tolist())
            i += 1
        return None

    def get(self, name: str, default: V | None = None) -> V | None:  # type: ignore[override]
        if not isinstance(name, str):  # as a dict of str keys answers
            return default
        found = self._delta[name] if name in self._delta else self._base(name)
        return default if found is None else found

    def __getitem__(self, name: str) -> V:
        found = self.get(name)
        if found is None:
            raise KeyError(name)
        return found

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[str]:
        for name, _ in self._pairs(records=False):
            yield name

    def items(self) -> Iterator[tuple[str, V]]:  # type: ignore[override]
        """``(name, record)`` pairs, read from the arrays in one pass (no lookup per name)."""
        return self._pairs(records=True)  # type: ignore[return-value]

    def values(self) -> Iterator[V]:  # type: ignore[override]
        return (record for _, record in self.items())

    def _pairs(self, records: bool) -> Iterator[tuple[str, V | None]]:
        delta = self._delta
        rows = iter(self._values.tolist()) if records else None
        for name in self._names:
            row = next(rows) if rows is not None else None
            if name not in delta:
                yield name, (self._record(name, row) if row is not None else None)
        yield from [(name, rec) for name, rec in delta.items() if rec is not None]

    def apply(self, name: str, record: V | None) -> None:
        """Record ``name`` with ``record``, or (None) remove it."""
        delta = self._delta
        old = delta[name] if name in delta else self._base(name) if len(self._hashes) else None
        if old is not None:
            self.total_bytes -= getattr(old, self.FIELDS[0])
            self._count -= 1
        if record is not None:
            self.total_bytes += getattr(record, self.FIELDS[0])
            self._count += 1
        delta[name] = record

    def update(self, pairs: Iterable[tuple[str, V]]) -> None:
        """``dict.update``: record every ``(name, record)``; a long run is merged into the arrays at once."""
        names: list[str] = []
        numbers: list[int] = []
        for name, record in pairs:
            names.append(name)
            numbers.extend(getattr(record, f) for f in self.FIELDS)
        rows = np.array(numbers, dtype=np.int64).reshape(-1, len(self.FIELDS))
        self.apply_rows(names, rows, np.ones(len(names), dtype=bool))
        self.settle()

    def settle(self) -> None:
        """Compact when the records since the last compaction outgrow an eighth of the arrays."""
        if len(self._delta) > max(_MIN_DELTA, len(self._names) // 8):
            self.compact()

    def apply_rows(self, names: list[str], rows: np.ndarray, live: np.ndarray) -> None:
        """:meth:`apply` for each of ``names`` in order (the last record of a name wins): ``rows[i]`` holds the
        fields where ``live[i]``, else the name was removed. A long run is merged into the arrays at once,
        without a record object per name."""
        if len(names) <= _MIN_DELTA:
            for name, row, alive in zip(names, rows.tolist(), live.tolist(), strict=True):
                self.apply(name, self._record(name, row) if alive else None)
            return
        self.compact()
        last = {name: i for i, name in enumerate(names)}
        pick = np.fromiter(last.values(), dtype=np.int64, count=len(last))
        alive = live[pick]
        self._merge_base(last, [n for n, a in zip(last, alive.tolist(), strict=True) if a], rows[pick[alive]])

    def columns(self) -> tuple[StringArray, np.ndarray]:
        """Every name and its fields' row, in one order (the arrays themselves: read them, do not change them)."""
        self.compact()
        return self._names, self._values

    def compact(self) -> None:
        """Merge the records since the last compaction into the arrays."""
        if not self._delta:
            return
        delta = self._delta
        # Lists of str and int only: a million tuples would wake the cyclic collector over and over.
        live = [n for n, e in delta.items() if e is not None]
        new = np.empty((len(live), len(self.FIELDS)), dtype=np.int64)
        for column, field in enumerate(self.FIELDS):
            new[:, column] = [getattr(delta[n], field) for n in live]
        self._merge_base(delta, live, new)

    def _merge_base(self, replaced: Mapping[str, object], names: list[str], rows: np.ndarray) -> None:
        """The arrays without the names in ``replaced``, plus ``names`` with ``rows``; nothing left in the dict."""
        base = list(self._names)
        keep = np.fromiter((n not in replaced for n in base), dtype=bool, count=len(base))
        merged = [n for n, k in zip(base, keep.tolist(), strict=True) if k] + names
        values = np.concatenate([self._values[keep], rows.reshape(-1, len(self.FIELDS))])
        hashes = np.fromiter((hash(n) for n in merged), dtype=np.int64, count=len(merged))
        order = np.argsort(hashes, kind="stable")
        self._set(StringArray([merged[i] for i in order.tolist()]), values[order], hashes[order])
        self._delta = {}
        self._count, self.total_bytes = len(merged), int(values[:, 0].sum())


class RemoteFiles(FlatRecords[RemoteFile]):
    """``relpath -> RemoteFile`` of a listed source (a ``StagedSource``'s listing)."""

    FIELDS = ("size", "mtime_ns")

    def _record(self, name: str, row: list[int]) -> RemoteFile:
        return RemoteFile(name, *row)


def _rebuilt(cls: type[FlatRecords[Any]], names: StringArray, values: np.ndarray) -> FlatRecords[Any]:
    out = cls()
    out._set(names, values)
    out._count, out.total_bytes = len(names), int(values[:, 0].sum()) if len(values) else 0
    return out

"""Many strings held as two flat arrays, so forked processes read them without copying pages.

A Python list of a million file names is a million ``str`` objects. A forked worker that reads one writes
its reference count, which copies the page holding it into the worker: an epoch that reads every name
copies the whole list once per worker (pytorch/pytorch#13246). :class:`StringArray` keeps the UTF-8 bytes
of every string in one ``bytes`` object and where each ends in one int64 NumPy array; reading item ``i``
builds a fresh ``str`` from a slice, and the only shared objects it touches are those two and itself.

Names that are not valid UTF-8 (POSIX file names are bytes) round-trip through ``surrogateescape``, as
``os.fsdecode`` gives them. Pickles as the two arrays (a few bytes per string beyond the text).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, SupportsIndex, overload

import numpy as np

__all__ = ["StringArray"]

_ERRORS = "surrogateescape"


class StringArray(Sequence[str]):
    """An immutable sequence of ``str`` stored as one blob of UTF-8 bytes and an int64 array of ends.

    Behaves as a read-only list: ``len``, indexing (negative too), slicing (a ``list``), iteration,
    ``in``, ``index``, equality with any sequence of strings.
    """

    __slots__ = ("_blob", "_ends", "_at")

    def __init__(self, strings: Iterable[str] = ()) -> None:
        strings = strings if isinstance(strings, list) else list(strings)
        text = "".join(strings)
        if text.isascii():  # the common case (file names): one encode, and a character is a byte
            blob, lengths = text.encode("ascii"), np.fromiter(map(len, strings), np.int64, len(strings))
        else:
            encoded = [s.encode("utf-8", _ERRORS) for s in strings]
            blob, lengths = b"".join(encoded), np.fromiter(map(len, encoded), np.int64, len(encoded))
        ends = np.zeros(len(strings) + 1, dtype=np.int64)
        np.cumsum(lengths, out=ends[1:])
        self._set(blob, ends)

    @classmethod
    def from_arrays(cls, blob: bytes, ends: np.ndarray) -> StringArray:
        """The strings ``blob[ends[i]:ends[i + 1]]`` (``ends[0] == 0``, non-decreasing, last ``len(blob)``)."""
        ends = np.array(ends, dtype=np.int64)  # a copy: this one is made read-only
        if (
            ends.ndim != 1
            or not len(ends)
            or ends[0] != 0
            or ends[-1] != len(blob)
            or (np.diff(ends) < 0).any()
        ):
            raise ValueError(f"StringArray: ends do not cut a blob of {len(blob)} bytes into strings")
        out = cls.__new__(cls)
        out._set(bytes(blob), ends)
        return out

    @classmethod
    def concat(cls, parts: Iterable[Sequence[str]]) -> StringArray:
        """One array of the strings of every part, in order (parts that are StringArrays are not decoded)."""
        arrays = [p if isinstance(p, StringArray) else StringArray(list(p)) for p in parts]
        if not arrays:
            return cls()
        starts = np.cumsum([0] + [len(a._blob) for a in arrays[:-1]], dtype=np.int64)
        ends = np.concatenate(
            [np.zeros(1, np.int64)] + [a._ends[1:] + s for a, s in zip(arrays, starts.tolist(), strict=True)]
        )
        return cls.from_arrays(b"".join(a._blob for a in arrays), ends)

    def _set(self, blob: bytes, ends: np.ndarray) -> None:
        ends.flags.writeable = False
        self._blob, self._ends = blob, ends
        self._at = ends.data  # a memoryview: its items are Python ints, ~4x faster to read than NumPy's

    @property
    def blob(self) -> bytes:
        """Every string's UTF-8 bytes, one after the other."""
        return self._blob

    @property
    def ends(self) -> np.ndarray:
        """``len(self) + 1`` offsets into :attr:`blob` (read-only): string ``i`` is ``ends[i]:ends[i + 1]``."""
        return self._ends

    @property
    def nbytes(self) -> int:
        """Bytes held: the blob and the offsets."""
        return len(self._blob) + self._ends.nbytes

    def __len__(self) -> int:
        return len(self._ends) - 1

    @overload
    def __getitem__(self, index: SupportsIndex) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: SupportsIndex | slice) -> str | list[str]:
        at = self._at
        if type(index) is int and index >= 0:  # the per-item path: a loader reading item ``index``
            try:
                return self._blob[at[index] : at[index + 1]].decode("utf-8", _ERRORS)
            except IndexError:
                pass  # past the end: the message below
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = operator.index(index)
        n = len(at) - 1
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"StringArray index {index} out of range ({n} strings)")
        return self._blob[at[i] : at[i + 1]].decode("utf-8", _ERRORS)

    def __iter__(self) -> Iterator[str]:
        blob, at = self._blob, self._at
        for i in range(len(at) - 1):
            yield blob[at[i] : at[i + 1]].decode("utf-8", _ERRORS)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringArray):
            return self._blob == other._blob and np.array_equal(self._ends, other._ends)
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are unhashable

    def __repr__(self) -> str:
        head = ", ".join(repr(s) for s in self[:3])
        return f"StringArray([{head}{', ...' if len(self) > 3 else ''}], {len(self)} strings)"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._blob, self._ends))


def _rebuild(blob: bytes, ends: np.ndarray) -> StringArray:
    return StringArray.from_arrays(blob, ends)

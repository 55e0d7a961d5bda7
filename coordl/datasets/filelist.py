"""A dataset's file list as flat arrays, and the list-like views its public attributes hand out.

``ImageFolder`` and ``FileListDataset`` used to hold ``items`` as a Python list of ``(path, label)`` tuples:
two objects per item whose reference counts every forked worker writes as it reads them, so each worker
copied the list's pages over an epoch (128 bytes per item per worker; pytorch/pytorch#13246). A
:class:`FileList` holds the names in one :class:`shmem.strings.StringArray` and integer (or float) targets in
one NumPy array: reading item ``i`` touches no per-item object, and the pickle sent to a spawned worker is
the arrays. Targets of any other type (strings, tuples, tensors) stay a Python list.

The public attributes (``items``, ``samples``, ``targets``...) are read-only views built on demand
(:class:`ListView` and subclasses): ``len``, indexing, slicing (a ``list``), iteration, ``in``, equality
with a list; ``list(view)`` gives the list torchvision has.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, SupportsIndex

import numpy as np

from shmem.strings import StringArray

__all__ = ["FileList", "ListView", "IndexedView", "ItemView", "Targets"]


class ListView(Sequence[Any]):
    """A read-only list computed item by item: subclasses define ``__len__`` and ``_at(i)`` (0 <= i < len)."""

    __slots__ = ()

    def _at(self, i: int) -> Any:
        raise NotImplementedError

    def __getitem__(self, index: SupportsIndex | slice) -> Any:
        n = len(self)
        if isinstance(index, slice):
            return [self._at(i) for i in range(*index.indices(n))]
        i = operator.index(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"{type(self).__name__} index {index} out of range ({n} items)")
        return self._at(i)

    def __iter__(self) -> Iterator[Any]:
        at = self._at
        for i in range(len(self)):
            yield at(i)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are unhashable

    def __repr__(self) -> str:
        head = ", ".join(repr(x) for x in self[:3])
        return f"{type(self).__name__}([{head}{', ...' if len(self) > 3 else ''}], {len(self)} items)"


class Targets(ListView):
    """Item targets: an int64 (float64) array when every target is a Python ``int`` (``float``), or all are
    None; a copy of a 1-D numeric NumPy array given as targets; a Python list otherwise. Items read back as the
    same values and types (a Python ``int``, or the NumPy scalar that indexing the given array gave)."""

    __slots__ = ("_values", "_n", "_scalars", "_get")
    _get: Callable[[int], Any]

    def __init__(self, targets: Sequence[Any] | None, n: int) -> None:
        values: Any = None
        if isinstance(targets, np.ndarray) and targets.ndim == 1 and targets.dtype.kind in "biuf":
            self._set(np.array(targets), n, scalars=True)
            return
        if targets is not None:
            kinds = {type(t) for t in targets}
            if not kinds or kinds == {type(None)}:
                values = None
            elif kinds in ({int}, {float}):
                try:
                    values = np.array(targets, dtype=np.int64 if kinds == {int} else np.float64)
                except OverflowError:  # an int past int64: kept as it is
                    values = list(targets)
            else:
                values = list(targets)
        self._set(values, n)

    def _set(self, values: Any, n: int, scalars: bool = False) -> None:
        self._values, self._n, self._scalars = values, n, scalars
        if isinstance(values, np.ndarray):
            values.flags.writeable = False
            # A memoryview's items are Python ints/floats (no NumPy scalar per read); NumPy's where it gave them.
            self._get = values.__getitem__ if scalars else values.data.__getitem__
        elif values is None:
            self._get = _none
        else:
            self._get = values.__getitem__

    @property
    def array(self) -> np.ndarray | None:
        """The NumPy array behind the targets (read-only), or None when they are not numbers."""
        return self._values if isinstance(self._values, np.ndarray) else None

    def __len__(self) -> int:
        return self._n

    def _at(self, i: int) -> Any:
        return self._get(i)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        values = self._values if isinstance(self._values, np.ndarray) else np.array(list(self))
        return np.array(values, dtype=dtype)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_targets, (self._values, self._n, self._scalars))


def _none(_: int) -> None:
    return None


def _targets(values: Any, n: int, scalars: bool) -> Targets:
    out = Targets.__new__(Targets)
    out._set(values, n, scalars)
    return out


class ItemView(ListView):
    """``(names[i], targets[i])`` tuples, as the list of pairs a dataset used to hold."""

    __slots__ = ("names", "targets")

    def __init__(self, names: Sequence[str], targets: Sequence[Any]) -> None:
        self.names, self.targets = names, targets

    def __len__(self) -> int:
        return len(self.names)

    def _at(self, i: int) -> tuple[str, Any]:
        return self.names[i], self.targets[i]


class IndexedView(ListView):
    """``fn(i)`` for ``i`` in ``range(n)``: e.g. ``(path, class_index)`` of a dataset's ``samples``."""

    __slots__ = ("_n", "_fn")

    def __init__(self, n: int, fn: Callable[[int], Any]) -> None:
        self._n, self._fn = n, fn

    def __len__(self) -> int:
        return self._n

    def _at(self, i: int) -> Any:
        return self._fn(i)


class FileList:
    """Item ``i`` is the file ``names[i]`` with target ``targets[i]``; both flat (see the module's docstring)."""

    __slots__ = ("names", "targets", "name", "target")

    def __init__(self, names: Iterable[str], targets: Sequence[Any] | None = None) -> None:
        names = names if isinstance(names, StringArray) else StringArray(names)
        if targets is not None and len(targets) != len(names):
            raise ValueError(f"FileList: {len(names)} names but {len(targets)} targets")
        self._set(names, targets if isinstance(targets, Targets) else Targets(targets, len(names)))

    def _set(self, names: StringArray, targets: Targets) -> None:
        self.names, self.targets = names, targets
        # The per-item accessors (a loader reads one item at a time): no view, no Python-level bounds check.
        self.name: Callable[[int], str] = names.__getitem__
        self.target: Callable[[int], Any] = targets._get

    def __reduce__(self) -> tuple[Any, ...]:
        return (_file_list, (self.names, self.targets))

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[str, Any]]) -> FileList:
        """From ``(name, target)`` pairs (what a dataset's ``items`` used to be, and what may be assigned to it)."""
        if isinstance(pairs, ItemView) and isinstance(pairs.names, StringArray):
            return cls(pairs.names, pairs.targets)
        names, targets = [], []
        for pair in pairs:
            name, target = pair
            names.append(name)
            targets.append(target)
        return cls(names, targets)

    def __len__(self) -> int:
        return len(self.names)

    def view(self) -> ItemView:
        """The ``(name, target)`` pairs."""
        return ItemView(self.names, self.targets)

    def digest(self) -> str:
        """16 hex digits over every ``name<TAB>target``: equal lists, equal digests (as the list of pairs had)."""
        h = hashlib.sha256()
        for name, target in zip(self.names, self.targets, strict=True):
            h.update(f"{name}\t{target}\n".encode())
        return h.hexdigest()[:16]


def _file_list(names: StringArray, targets: Targets) -> FileList:
    out = FileList.__new__(FileList)
    out._set(names, targets)
    return out

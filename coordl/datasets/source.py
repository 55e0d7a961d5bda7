"""The fetch/prep split: the protocol every coordl data source implements.

A torch ``Dataset.__getitem__`` hides the boundary between reading bytes from storage (*fetch*) and
the CPU work done on them (*prep*). Every technique in coordl needs that boundary: the MinIO cache
stores fetched bytes, coordinated prep shares prepped batches, memcache stores the deterministic part
of prep. So a coordl data source exposes the two halves separately::

    len(src)                  number of items
    src.fetch(i) -> bytes     raw bytes of item i, exactly as stored (no decoding)
    src.prep(raw, i)          the training sample made from those bytes

Optionally, a source whose prep has a deterministic prefix (decode, resize) followed by random
augmentation exposes that split too, so that the deterministic result can be cached as an array:

    src.prep_deterministic(raw, i) -> numpy.ndarray
    src.prep_random(array, i)      -> sample
    src.prep_identity() -> str      changes whenever the deterministic part changes
    src.dataset_identity() -> str   names the data (root path, file list digest)

``prep(raw, i)`` must equal ``prep_random(prep_deterministic(raw, i), i)`` in distribution.
"""

from __future__ import annotations

import numbers
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["ItemSource", "SplitPrepSource", "is_item_source", "has_split_prep", "describe_item", "is_index"]


@runtime_checkable
class ItemSource(Protocol):
    """A dataset whose items are fetched as raw bytes and then prepared on the CPU."""

    def __len__(self) -> int: ...

    def fetch(self, index: int) -> bytes:
        """Return the raw stored bytes of item ``index``."""
        ...

    def prep(self, raw: bytes, index: int) -> Any:
        """Turn raw bytes of item ``index`` into a training sample."""
        ...


@runtime_checkable
class SplitPrepSource(ItemSource, Protocol):
    """An item source whose prep is a cacheable deterministic part followed by a random part."""

    def prep_deterministic(self, raw: bytes, index: int) -> np.ndarray: ...

    def prep_random(self, array: np.ndarray, index: int) -> Any: ...

    def prep_identity(self) -> str: ...

    def dataset_identity(self) -> str: ...


def is_item_source(obj: object) -> bool:
    """True when ``obj`` has ``__len__``, ``fetch`` and ``prep`` (duck-typed, no base class needed)."""
    return all(callable(getattr(obj, name, None)) for name in ("__len__", "fetch", "prep"))


def has_split_prep(obj: object) -> bool:
    """True when ``obj`` also exposes the deterministic/random split of its prep."""
    names = ("prep_deterministic", "prep_random", "prep_identity", "dataset_identity")
    return is_item_source(obj) and all(callable(getattr(obj, n, None)) for n in names)


def is_index(key: Any) -> bool:
    """An item index (what ``fetch`` takes, and the fetch tiers' key): an int or NumPy integer; a bool,
    list, slice... is a key of the user's dataset (:mod:`coordl.fetch.keys`)."""
    if isinstance(key, int):  # int and its subclasses (a seeded index) without the ABC check: per item
        return type(key) is not bool
    return isinstance(key, numbers.Integral) and not isinstance(key, np.bool_)


def describe_item(source: object, index: int) -> str:
    """A human-readable name for item ``index`` (its file path when the source knows it)."""
    describe = getattr(source, "describe", None)
    if callable(describe):
        try:
            return str(describe(index))
        except Exception:  # describing must never mask the error being reported
            pass
    return f"item {index}"

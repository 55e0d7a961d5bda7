"""What torch hands the dataset, the dataset gets: keys that are not item indices, and ``__getitems__``.

torch's fetcher calls ``dataset[key]`` with whatever the sampler yields (with ``batch_size=None`` a list,
a tuple, a slice or a name is a key like any other: bulk loading reads a batch in one ``dataset[[i, j]]``)
and ``dataset.__getitems__(indices)`` for a batch when the dataset defines it. coordl's fetch tiers are
keyed by item index (an int), so:

* a key that is not an item index goes to ``dataset[key]`` as it is, past the tiers; nothing is cached;
* a dataset coordl runs as one opaque stage (no fetch/prep split: no tier holds its raw bytes anyway)
  that defines ``__getitems__`` gets each batch in one call, as in torch.

``dataset`` is the user's: behind coordl's adapters (:mod:`coordl.datasets.adapt`) their ``.dataset``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from coordl.datasets.adapt import OpaqueSource, TorchvisionStyleSource
from coordl.errors import CorruptItemError
from shmem.counters import SharedCounters

__all__ = ["DatasetKeys"]

log = logging.getLogger("coordl")


class DatasetKeys:
    """Reads by key from the dataset torch would index, counting what it loads.

    Args:
        source: the loader's item source (an adapter of the user's dataset, or a source of its own).
        counters: shared counters with ``items_loaded`` and ``skipped_items``.
        on_error: the loader's ``on_error`` ("skip" drops items whose read raises CorruptItemError).
    """

    def __init__(self, source: Any, counters: SharedCounters, on_error: str) -> None:
        self.dataset = (
            source.dataset if isinstance(source, (OpaqueSource, TorchvisionStyleSource)) else source
        )
        self.counters = counters
        self.on_error = on_error
        getitems = getattr(self.dataset, "__getitems__", None)
        # Used for whole batches of item indices only for a dataset run as one opaque stage.
        self.batched: Callable[[list], Any] | None = (
            getitems if isinstance(source, OpaqueSource) and callable(getitems) else None
        )

    def get(self, key: Any) -> Any:
        """``dataset[key]`` exactly as torch would call it."""
        getitem = getattr(self.dataset, "__getitem__", None)
        if not callable(getitem):
            name = type(self.dataset).__name__
            raise TypeError(
                f"coordl.DataLoader: the sampler gave the key {key!r} ({type(key).__name__}), not an item index; "
                f"{name} is a fetch/prep source read by int index only. Give {name} a __getitem__ that "
                "takes such keys, or have the sampler yield ints."
            )
        sample = getitem(key)
        self.counters.add("items_loaded")
        return sample

    def get_many(self, keys: Sequence[Any]) -> Any:
        """A batch of keys: ``__getitems__`` if the dataset has one, else ``dataset[key]`` each, as torch's
        fetcher does (with ``on_error="skip"``, keys whose read raises CorruptItemError are dropped)."""
        getitems = getattr(self.dataset, "__getitems__", None)
        if callable(getitems):
            samples = getitems(list(keys))
            self.counters.add("items_loaded", len(keys))
            return samples
        kept = []
        for key in keys:
            try:
                kept.append(self.get(key))
            except CorruptItemError as e:
                if self.on_error != "skip":
                    raise
                log.warning("coordl: skipping %r: %s", key, e)
                self.counters.add("skipped_items")
        return kept

"""The order of a map-style epoch, kept resumable: the sampler torch is handed, in the main process.

:class:`ResumableSampler` wraps the sampler (or batch sampler) torch would have used. torch draws
indices ahead of the batches the user gets (``prefetch_factor * num_workers`` batches with workers),
so the wrapper notes a Stateful sampler's state after each batch it hands out and the loader keeps
the one of the last batch the user got (torchdata takes its main-process snapshots the same way). On
resume it either restores that state (a Stateful sampler or sampler iterator positions itself) or skips
the batches already returned (any other sampler: they are never fetched or prepped again), drops the
later batches already handed out out of order, and yields first the pad batches that keep torch's
worker turns. Out of order, each batch's first index carries the batch's number in the epoch, so the
state can name the batches handed out.
"""

from __future__ import annotations

import collections
import copy
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from coordl.datasets.source import is_index
from coordl.resume.state import is_stateful
from coordl.resume.workers import PAD

__all__ = ["ResumableSampler", "SeededIndex", "batch_seeds", "item_seed"]


def _seeded(key: Any, seed: int) -> Any:
    """The first key of a batch, tagged with the epoch's seed (and so its own); any other key (a list, a
    slice, a name) as it is."""
    return SeededIndex(int(key), item_seed(seed, int(key)), epoch_seed=seed) if is_index(key) else key


def _numbered(key: Any, number: int) -> Any:
    """The first key of batch ``number``, carrying that number (keeping its seeds); a key that is not an
    index as it is (its batch is then counted, not named)."""
    if not is_index(key):
        return key
    return SeededIndex(int(key), getattr(key, "seed", None), number, getattr(key, "epoch_seed", None))


class SeededIndex(int):
    """An item index that carries the seed its prep's random draws start from (None: none), and, first
    in a batch of an epoch handed out out of order, that batch's number in the epoch (pickles as an int
    does).

    First in a batch of an epoch with seeds, it also carries the epoch's seed (``epoch_seed``): the
    batch's other indices are plain ints, whose seeds the worker derives (:func:`batch_seeds`), so that
    the main process makes one object per batch, not one per item.
    """

    seed: int | None
    batch: int | None
    epoch_seed: int | None

    def __new__(
        cls, index: int, seed: int | None, batch: int | None = None, epoch_seed: int | None = None
    ) -> SeededIndex:
        obj = super().__new__(cls, index)
        obj.seed = seed
        obj.batch = batch
        obj.epoch_seed = epoch_seed
        return obj

    def __reduce__(self) -> tuple:
        return (SeededIndex, (int(self), self.seed, self.batch, self.epoch_seed))


# SplitMix64's constants (Steele, Lea and Flood, OOPSLA 2014): the golden-ratio step and the finaliser.
_GOLDEN, _MIX1, _MIX2 = (
    np.uint64(0x9E3779B97F4A7C15),
    np.uint64(0xBF58476D1CE4E5B9),
    np.uint64(0x94D049BB133111EB),
)
_MASK64 = (1 << 64) - 1


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, in place on an array of uint64 (a bijection: distinct in, distinct out)."""
    z ^= z >> np.uint64(30)
    z *= _MIX1
    z ^= z >> np.uint64(27)
    z *= _MIX2
    z ^= z >> np.uint64(31)
    return z


def _seeds_of(epoch_seed: int, indices: Sequence[Any]) -> list[Any]:
    """The 63-bit seed of each of ``indices`` in the epoch whose seed is ``epoch_seed``: SplitMix64's
    output at step ``index + 1`` of the stream keyed by the (mixed) epoch seed, one NumPy pass per batch
    (a hash per item in Python cost 0.5 us, a third of the seeding)."""
    key = _mix64(np.array([epoch_seed & _MASK64], dtype=np.uint64))
    z = np.array(indices, dtype=np.int64).astype(np.uint64)
    z += np.uint64(1)
    z *= _GOLDEN
    z += key
    return (_mix64(z) >> np.uint64(1)).tolist()


def item_seed(epoch_seed: int, index: int) -> int:
    """A 63-bit seed for item ``index`` in the epoch whose seed is ``epoch_seed``."""
    return _seeds_of(epoch_seed, [index])[0]


def batch_seeds(batch: Sequence[Any]) -> list[int | None]:
    """The prep seed of each index of ``batch``, as the sampler drew it: derived from the epoch's seed its
    first index carries (:func:`item_seed` of each), else each index's own (None: no seed)."""
    epoch_seed = getattr(batch[0], "epoch_seed", None) if batch else None
    if epoch_seed is None:
        return [getattr(i, "seed", None) for i in batch]
    return _seeds_of(epoch_seed, batch)


class ResumableSampler:
    """Wraps a sampler (or a batch sampler): skips or restores the start of its next pass, notes a
    Stateful sampler's state per batch handed out, and tags each index with its prep seed when an
    epoch seed is set.

    Args:
        inner: the sampler torch would have used (``RandomSampler``, ``SequentialSampler``, the user's,
            or :class:`coordl.partitioned.ownership.PartitionedSampler`), or a batch sampler.
        batched: ``inner`` yields lists of indices (a batch sampler).
        unit: items per batch when not ``batched`` (the loader's ``batch_size``).
        shuffle_generator: draw each pass as one ``randperm`` of ``len(inner)`` from this generator
            instead of iterating ``inner`` (coordl's shuffle without ``generator=``: the same draws as
            torchdata's ``StatefulDataLoader``).
    """

    def __init__(
        self,
        inner: Any,
        *,
        batched: bool = False,
        unit: int = 1,
        shuffle_generator: torch.Generator | None = None,
    ) -> None:
        self.inner = inner
        self.batched = batched
        self.unit = 1 if batched else max(1, unit)
        self.shuffle_generator = shuffle_generator
        self.skip = 0  # items (batches when batched) of the next pass not to yield
        # The next pass: its first batch's number in the epoch (after the skip), the numbers of batches
        # after it already handed out (not yielded), the pad batches that come first (they move torch's
        # turn to the worker whose turn it was), and whether each batch's first index carries its number.
        self.first = 0
        self.drop: frozenset[int] = frozenset()
        self.pads = 0
        self.number = False
        self.epoch_seed: int | None = None
        self.inner_epoch: int | None = None  # the inner sampler's epoch in the pass now running
        self.restore: dict[str, Any] | None = None  # a Stateful sampler's saved state, for the next pass
        self.snapshots: collections.deque = collections.deque()  # states after batches handed out
        self.passes = 0  # passes started (a state taken at rest after one finishes the pass on load)
        self.current: Any = None  # the inner iterator of the pass running
        self.on_start: Callable[[], Any] | None = None  # run once the next pass is positioned

    def __iter__(self) -> Iterator[Any]:
        skip, self.skip = self.skip, 0
        first, drop, pads, self.first, self.drop, self.pads = (
            self.first,
            self.drop,
            self.pads,
            0,
            frozenset(),
            0,
        )
        self.snapshots.clear()
        it = self._start()
        self.current = it
        self.inner_epoch = getattr(self.inner, "epoch", None)
        track = self.tracks(it)
        seed, number, unit = self.epoch_seed, self.number, self.unit
        count = 0
        for _ in itertools.islice(it, skip):  # torchdata's fast-forward: drawn, never fetched
            pass
        on_start, self.on_start = self.on_start, None
        if on_start is not None:
            on_start()
        for _ in range(pads):  # never fetched: the source and the collate pass them through
            yield from [[PAD]] if self.batched else [PAD] * unit
        for item in it:
            count += 1
            if track and count % unit == 0:
                self.snapshots.append(self.snapshot(it))
            if drop and first + (count - 1) // unit in drop:
                continue  # handed out before the state was taken (out of order): drawn, not fetched
            if seed is not None and (self.batched or (count - 1) % unit == 0):
                # the batch's first index carries the epoch's seed; the worker derives the others' seeds
                item = [_seeded(item[0], seed), *item[1:]] if self.batched and item else _seeded(item, seed)
            if number and (self.batched or (count - 1) % unit == 0):
                n = first + (count - 1) // unit
                item = [_numbered(item[0], n), *item[1:]] if self.batched and item else _numbered(item, n)
            yield item
        if track and count % unit:
            self.snapshots.append(self.snapshot(it))  # the last, partial batch

    def _start(self) -> Iterator[Any]:
        """The inner iterator of a new pass, with a saved Stateful state restored first (torchdata's
        order: the sampler's state, then a new iterator, then the iterator's state)."""
        restore, self.restore = self.restore, None
        self.passes += 1
        if restore is not None and restore.get("state") is not None:
            self.inner.load_state_dict(restore["state"])
        it = self._inner_iter()
        if restore is not None and restore.get("iter") is not None and is_stateful(it):
            it.load_state_dict(restore["iter"])
        if restore is not None and restore.get("drain"):
            # The state was taken at rest after a pass: finish that pass, then start the next one.
            for _ in it:
                pass
            it = self._inner_iter()
        return it

    def _inner_iter(self) -> Iterator[Any]:
        if self.shuffle_generator is not None:
            return iter(torch.randperm(len(self.inner), generator=self.shuffle_generator).tolist())
        return iter(self.inner)

    def tracks(self, it: Any = None) -> bool:
        """Whether the sampler (or its iterator) saves its own state (the Stateful protocol)."""
        return is_stateful(self.inner) or (it is not None and is_stateful(it))

    def snapshot(self, it: Any = None) -> dict[str, Any]:
        """The sampler's state and its iterator's, now (copies: the sampler goes on changing)."""
        it = self.current if it is None else it
        return {
            "state": copy.deepcopy(self.inner.state_dict()) if is_stateful(self.inner) else None,
            "iter": copy.deepcopy(it.state_dict()) if it is not None and is_stateful(it) else None,
            "drain": False,
        }

    def __len__(self) -> int:
        return len(self.inner)

    def set_epoch(self, epoch: int) -> None:
        """Passed on to the inner sampler (``DistributedSampler``-style samplers need it each epoch)."""
        if hasattr(self.inner, "set_epoch"):
            self.inner.set_epoch(epoch)

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("inner")
        if inner is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(inner, name)

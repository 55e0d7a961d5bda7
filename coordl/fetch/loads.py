"""The per-item chain of a batch inside a loader worker: each item's bytes, its seed, its prep.

:class:`BatchLoads` holds the four ways a worker loads a batch's items (the dataset's own
``__getitems__``, the sample cache, read-ahead, and the plain loop every in-memory batch takes), each one
loop over the batch's items, written out so that an item costs no more calls than it must (issue 59: the
loader's own cost per item is held to torch's). :class:`coordl.fetch.pipeline.LoaderSource` frames the
batch around them (its keys, its number, the ring slot its samples go to, its counts) and picks the loop.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from coordl.datasets.adapt import OpaqueSource
from coordl.errors import CorruptItemError
from coordl.fetch.ahead import FetchAhead
from coordl.fetch.keys import DatasetKeys
from coordl.fetch.pace import ReadPace
from coordl.fetch.skipping import SkipLog
from coordl.fetch.tiers import TierLookup
from coordl.fetch.watch import WorkerWatch
from coordl.resume.order import batch_seeds

__all__ = ["BatchLoads"]


class BatchLoads:
    """The items of one batch fetched (tiers, then storage), seeded and prepped, one loop per way.

    Args:
        source: the item source (``len``, ``fetch``, ``prep``).
        lookup: the fetch tiers and storage the bytes come from.
        keys: the dataset's keys and its own ``__getitems__`` (``keys.batched``), if any.
        skips: what an item whose prep raised :class:`CorruptItemError` becomes (``on_error``).
        on_error: "raise" or "skip".
        sample_cache_tier: optional memcache tier (``get_many`` / ``put_many``) for split-prep sources.
        watch: optional worker table, told the item each worker is on.
        fetch_ahead: items read ahead by background threads while the worker preps (0: in turn).
    """

    def __init__(
        self,
        source: Any,
        lookup: TierLookup,
        keys: DatasetKeys,
        skips: SkipLog,
        *,
        on_error: str,
        sample_cache_tier: Any,
        watch: WorkerWatch | None,
        fetch_ahead: int,
    ) -> None:
        self.source = source
        self._lookup = lookup
        self._keys = keys
        self._skips = skips
        self.on_error = on_error
        self.sample_cache_tier = sample_cache_tier
        self.watch = watch
        self.fetch_ahead = fetch_ahead
        self._item_seeds: dict[int, int] = {}
        self._batch_seeds: tuple[Sequence[Any], list[int | None]] | None = None
        # A source whose prep reads views (coordl's Decode first) preps a cached item straight from its
        # cache row: no copy of the item into bytes first.
        self._ahead = FetchAhead(fetch_ahead, lookup, getattr(source, "prep_reads_buffers", False) is True)

    def seeds(self, indices: Sequence[Any]) -> list[int | None] | None:
        """The batch's per-item seeds (None: the epoch has none), kept for :meth:`seed` too.

        Indices may carry the seed of their prep's random draws (:class:`coordl.resume.SeededIndex`):
        the first one the epoch's, from which the others' are derived (:func:`batch_seeds`)."""
        first = indices[0] if indices else None
        seeds = batch_seeds(indices) if getattr(first, "seed", None) is not None else None
        # index -> seed, made by the first seed() of the batch (the plain loop reads the list instead)
        self._batch_seeds = (indices, seeds) if seeds else None
        self._item_seeds = {}
        return seeds

    def seed(self, index: int) -> None:
        """Seed torch's RNG for ``index``'s prep when its index carried a seed (resumable epochs)."""
        if self._batch_seeds is not None:
            indices, seeds = self._batch_seeds
            self._batch_seeds = None
            self._item_seeds = {int(i): s for i, s in zip(indices, seeds, strict=True) if s is not None}
        seed = self._item_seeds.get(index) if self._item_seeds else None
        if seed is not None:
            # The CPU generator only: torch.manual_seed also queues a seed for every accelerator
            # backend, formatting the call stack each time it is not initialised (0.5 ms per item,
            # a fifth of a sample's prep; measured in bench_loader's prep-bound run).
            torch.default_generator.manual_seed(seed)

    def samples(
        self, keys: list[int], seeds: list[int | None] | None, in_worker: bool, worker_id: int | None
    ) -> Iterator[Any]:
        """The batch's samples in order (:data:`coordl.fetch.skipping.SKIPPED` for a dropped one), by the
        cheapest loop that serves it: the sample cache, read-ahead (only in a loader worker, only where
        some item needs a read that blocks), or the plain loop."""
        lookup = self._lookup
        if self.sample_cache_tier is not None:
            return self.split(keys, worker_id)
        lookup.ask_batched(keys)
        copy = not self._ahead.prep_views  # the cache's hits as the bytes prep reads, not as views
        if self.fetch_ahead > 0 and in_worker and len(keys) > 1:
            # A batch the MinIO cache holds whole reads nothing ahead: its items are in memory.
            known = lookup.peek_memory(keys, copy)
            pace = self._ahead.pace()
            if known is not None and known[1] == 0:
                return self.plain(keys, seeds, worker_id, raws=known[0])
            if known is None and not lookup.tiers and not pace.slow:
                # storage that answers at once (the page cache): read in this thread, in turn, timed
                return self.plain(keys, seeds, worker_id, pace=pace)
            return self.ahead(keys, worker_id, known[0] if known is not None else None)
        known = lookup.peek_memory(keys, copy)  # the MinIO cache asked once for the whole batch
        return self.plain(keys, seeds, worker_id, raws=known[0] if known is not None else None)

    def batched(self, indices: Sequence[int], worker_id: int | None) -> Any:
        """The dataset's ``__getitems__`` for the whole batch (its random draws follow the first item's
        seed), or None: with ``on_error="skip"`` a batch whose call raised CorruptItemError is loaded item
        by item, so that only the bad items are dropped."""
        batched = self._keys.batched
        assert batched is not None  # called only when the dataset has a batched read
        keys = [int(i) for i in indices]
        if keys:
            self.seed(keys[0])
            if worker_id is not None:
                watch = self.watch
                assert watch is not None  # worker_id is set only with a watch
                watch.on_item(worker_id, keys[0])
        try:
            return batched(keys)
        except CorruptItemError:
            if self.on_error != "skip":
                raise
            return None

    def plain(
        self,
        keys: list[int],
        seeds: list[int | None] | None,
        worker_id: int | None,
        raws: list[Any] | None = None,
        pace: ReadPace | None = None,
    ) -> Iterator[Any]:
        """Fetch and prep each item in turn: the batch's fetch (:meth:`TierLookup.batch_fetch`, counted
        per batch), or ``raws``, the bytes already in hand (views of the cache's rows; None where the
        cache missed: read through the fetch then).

        The per-item path of every in-memory dataset, so it holds only what each item needs: the worker
        table told the item, its bytes, its seed (``seeds``, when the epoch has them), its prep. With
        ``pace``, each read is timed, and once storage is found slow the rest of the batch is read
        ahead (:meth:`ahead`).
        """
        lookup = self._lookup
        views = self._ahead.prep_views
        if raws is None and pace is None and type(self.source) is OpaqueSource and not lookup.tiers:
            # A dataset run as one stage fetches b"" (nothing to time, cache or copy): its reads are counted.
            lookup.count_reads(len(keys))
            raws, views = [b""] * len(keys), True
        fetch = lookup.batch_fetch(views, asked=raws is not None) if raws is None or None in raws else None
        watch = self.watch
        # the worker table's store of each item (a C call), set up once per batch
        on_item = watch.item_writer(worker_id) if worker_id is not None and watch is not None else None
        if pace is not None:
            return self._paced(keys, seeds, worker_id, on_item, fetch, pace)
        return self._in_turn(keys, seeds, on_item, raws, views, fetch)

    def _in_turn(
        self,
        keys: list[int],
        seeds: list[int | None] | None,
        on_item: Callable[[int], None] | None,
        raws: list[Any] | None,
        views: bool,
        fetch: Callable[[int], Any] | None,
    ) -> Iterator[Any]:
        """:meth:`plain`'s loop: each item's bytes (in hand, else ``fetch``), seed and prep."""
        prep, skip = self.source.prep, self._skips.skip_or_raise
        reseed = torch.default_generator.manual_seed  # the CPU generator only: see seed()
        nothing = itertools.repeat(None)
        for index, raw, seed in zip(
            keys, nothing if raws is None else raws, nothing if seeds is None else seeds, strict=False
        ):  # strict=False: repeat(None) stands for the bytes or seeds a batch has none of
            if on_item is not None:
                on_item(index)
            try:
                if raw is None:
                    assert fetch is not None  # made whenever an item has no bytes in hand
                    raw = fetch(index)
                elif not views:
                    raw = bytes(raw)  # a cache row's view as the bytes the protocol promises (bytes: as is)
                if seed is not None:
                    reseed(seed)
                sample = prep(raw, index)
            except CorruptItemError as e:
                sample = skip(e, index)
            yield sample

    def _paced(
        self,
        keys: list[int],
        seeds: list[int | None] | None,
        worker_id: int | None,
        on_item: Callable[[int], None] | None,
        fetch: Any,
        pace: ReadPace,
    ) -> Iterator[Any]:
        """:meth:`plain` for storage read in this thread with each read timed: once storage is found
        slow, the rest of the batch is read ahead (:meth:`ahead`)."""
        prep, skip = self.source.prep, self._skips.skip_or_raise
        reseed = torch.default_generator.manual_seed  # the CPU generator only: see seed()
        for k, index in enumerate(keys):
            if pace.slow:
                yield from self.ahead(keys[k:], worker_id)
                return
            if on_item is not None:
                on_item(index)
            try:
                raw = pace.timed_call(fetch, index)
                if seeds is not None and (seed := seeds[k]) is not None:
                    reseed(seed)
                sample = prep(raw, index)
            except CorruptItemError as e:
                sample = skip(e, index)
            yield sample

    def ahead(
        self, indices: list[int], worker_id: int | None, known: list[Any] | None = None
    ) -> Iterator[Any]:
        """Prep each item while background threads read the next ``fetch_ahead`` ones (:mod:`.ahead`)."""
        return self._ahead.load(
            indices, worker_id, self.watch, self.seed, self._skips.skip_or_raise, known=known
        )

    def split(self, indices: Sequence[int], worker_id: int | None) -> Iterator[Any]:
        """The deterministic part of each item's prep from the sample cache (made and stored where it
        misses), then its random part, seeded."""
        indices = [int(i) for i in indices]
        arrays = self.sample_cache_tier.get_many(indices)
        self._lookup.ask_batched([i for i in indices if i not in arrays])
        fresh = {}
        for index in indices:
            if worker_id is not None:
                watch = self.watch
                assert watch is not None  # worker_id is set only with a watch
                watch.on_item(worker_id, index)
            try:
                arr = arrays.get(index)
                if arr is None:
                    arr = self.source.prep_deterministic(self._lookup.fetch(index), index)
                    fresh[index] = arr
                self.seed(index)
                sample = self.source.prep_random(arr, index)
            except CorruptItemError as e:
                sample = self._skips.skip_or_raise(e, index)
            yield sample
        if fresh:
            self.sample_cache_tier.put_many(fresh)

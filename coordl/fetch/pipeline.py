"""The per-item path inside a loader worker: fetch through a chain of tiers, then prep.

``LoaderSource`` is the map-style torch ``Dataset`` that ``coordl.DataLoader`` hands to
``torch.utils.data.DataLoader``; torch's fetcher calls its batched ``__getitems__``. For each index it
asks the fetch tiers in order (MinIO cache, later a peer's cache), falls back to ``source.fetch``
(storage), offers the bytes to the tiers that missed (:mod:`coordl.fetch.tiers`), and preps them, with
the next items' reads in flight ahead of the prep (:mod:`coordl.fetch.ahead`). Optionally the
deterministic part of prep is looked up in / stored to a sample cache (memcache) first.

What torch would hand the dataset, the dataset gets (:mod:`coordl.fetch.keys`): a key that is not an
item index goes to ``dataset[key]`` as it is, and a dataset run as one opaque stage that defines
``__getitems__`` gets each batch in one call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch.utils.data

from coordl.datasets.adapt import OpaqueSource
from coordl.datasets.source import describe_item, is_index
from coordl.errors import CorruptItemError
from coordl.fetch.ahead import FetchAhead
from coordl.fetch.keys import DatasetKeys
from coordl.fetch.pace import ReadPace
from coordl.fetch.pagecache import check_mode
from coordl.fetch.skipping import SKIPPED, SkipLog
from coordl.fetch.tiers import BASE_COUNTERS, FetchTier, MinioTier, TierLookup, as_bytes
from coordl.fetch.watch import WorkerWatch
from coordl.resume.order import SeededIndex, batch_seeds
from coordl.resume.workers import PAD, note_batch
from coordl.ring.output_buffers import lend
from shmem.counters import SharedCounters

__all__ = ["FetchTier", "MinioTier", "LoaderSource", "BASE_COUNTERS"]

_INDEX_TYPES = frozenset({int, SeededIndex})


class LoaderSource(torch.utils.data.Dataset):
    """A torch Dataset running fetch tiers -> storage -> prep for an item source.

    Why this class is long: it holds the four ways a worker loads a batch (the dataset's own
    ``__getitems__``, the sample cache, read-ahead, and the plain loop every in-memory batch takes), each
    one loop over the batch's items, written out so that an item costs no more calls than it must
    (issue 59: the loader's own cost per item is held to torch's).

    Args:
        source: the item source (``len``, ``fetch``, ``prep``).
        tiers: fetch tiers, asked in order before storage.
        counters: shared counters holding at least :data:`BASE_COUNTERS`.
        on_error: "raise" or "skip" (drop items whose prep raises :class:`CorruptItemError`).
        sample_cache_tier: optional memcache tier (``get_many`` / ``put_many``) for split-prep sources.
        watch: optional worker table, updated with the item each worker is on.
        fetch_ahead: in a loader worker, items of the batch fetched ahead by background threads while
            the worker preps (0: fetch and prep in turn). ``source.fetch`` must be thread-safe.
        ring: the batch ring's collate (:class:`coordl.ring.writer.RingCollate`), or None: with it,
            samples are stacked into a ring slot as they are made.
        page_cache: whether storage reads go through the OS page cache: ``"auto"``, ``"use"`` or
            ``"bypass"`` (:mod:`coordl.fetch.pagecache`; only for sources with ``fetch_uncached``).

    ``fetch(index)`` gives the raw bytes of ``index`` from the first tier that has them, else storage
    (then offered to the tiers that missed): :meth:`coordl.fetch.tiers.TierLookup.fetch`.
    """

    def __init__(
        self,
        source: Any,
        tiers: Sequence[FetchTier],
        counters: SharedCounters,
        *,
        on_error: str = "raise",
        sample_cache_tier: Any = None,
        watch: WorkerWatch | None = None,
        fetch_ahead: int = 0,
        ring: Any = None,
        page_cache: str = "auto",
    ) -> None:
        check_mode(page_cache)
        self.source = source
        self._lookup = TierLookup(source, tiers, counters, page_cache)
        self.tiers = self._lookup.tiers  # the same list: the loader inserts and removes tiers in it
        # The lookup's own method: an item's fetch costs no extra call or attribute hop.
        self.fetch: Callable[[int], bytes] = self._lookup.fetch
        self.fetch_many: Callable[..., list[bytes]] = self._lookup.fetch_many
        self.counters = counters
        self.on_error = on_error
        self.sample_cache_tier = sample_cache_tier
        self.watch = watch
        self.ring = ring
        self.page_cache = page_cache
        self._item_seeds: dict[int, int] = {}
        self.fetch_ahead = int(fetch_ahead)
        # A source whose prep reads views (coordl's Decode first) preps a cached item straight from its
        # cache row: no copy of the item into bytes first.
        self._ahead = FetchAhead(
            self.fetch_ahead, self._lookup, getattr(source, "prep_reads_buffers", False) is True
        )
        self._keys = DatasetKeys(source, counters, on_error)  # keys that are not indices; __getitems__
        self._skips = SkipLog(source, on_error)  # the items dropped with on_error="skip", logged once

    def __len__(self) -> int:
        return len(self.source)

    @property
    def user_dataset(self) -> Any:
        """The user's dataset these items are read from (behind coordl's adapters)."""
        return self._keys.dataset

    def __getitem__(self, index: Any) -> Any:
        if not is_index(index):  # batch_size=None and a sampler of lists, slices, names...: dataset[key]
            return PAD if index is PAD else self._keys.get(index)  # a resumed pass's pad: not an item
        out = self._get_many([index], stack=False)
        if not out:
            # Only reachable without batching, which the loader refuses with on_error="skip".
            raise CorruptItemError(f"{describe_item(self.source, index)} was skipped", index=index)
        return out[0]

    def __getitems__(self, indices: Sequence[Any]) -> Any:
        # ints (the first maybe carrying its seeds) are indices; the type check per item is C's, not ours
        if not _INDEX_TYPES.issuperset(map(type, indices)) and not all(is_index(i) for i in indices):
            if indices[0] is PAD:  # a resumed pass's pad batch (coordl.resume): the collate drops it
                return list(indices)
            return self._keys.get_many(indices)
        return self._get_many(indices, stack=True)

    def _get_many(self, indices: Sequence[int], stack: bool) -> Any:
        """The batch's samples (skipped ones left out), or, with the batch ring, the stacked batch."""
        worker = torch.utils.data.get_worker_info()
        worker_id = worker.id if worker is not None and self.watch is not None else None
        # Indices may carry the seed of their prep's random draws (coordl.resume.SeededIndex), and the
        # first the batch's number in its epoch (handed out of order: the resumable state names it).
        first = indices[0] if indices else None
        seeds = batch_seeds(indices) if getattr(first, "seed", None) is not None else None
        self._item_seeds = (
            {int(i): seed for i, seed in zip(indices, seeds, strict=True) if seed is not None}
            if seeds
            else {}
        )
        if (number := getattr(first, "batch", None)) is not None:
            note_batch(number)
        batched = self._load_batched(indices, worker_id) if self._keys.batched is not None and stack else None
        # The dataset's own batch: collate gets it as is.
        if batched is not None and type(batched) is not list:
            self.counters.add("items_loaded", len(indices))
            return batched
        stacker = self.ring.stacker(len(indices)) if stack and self.ring is not None else None
        keys = [int(i) for i in indices]
        if self.sample_cache_tier is None and batched is None:
            self._lookup.ask_batched(keys)
        kept: list[Any] = []
        n_kept = n_skipped = 0
        try:
            if batched is not None:
                samples: Any = iter(batched)
            elif self.sample_cache_tier is not None:
                samples = self._load_split(keys, worker_id)
            elif self.fetch_ahead > 0 and worker is not None and len(keys) > 1:
                # A batch the MinIO cache holds whole reads nothing ahead: its items are in memory.
                known = self._lookup.peek_memory(keys)
                pace = self._ahead.pace()
                if known is not None and known[1] == 0:
                    samples = self._load_plain(keys, seeds, worker_id, raws=known[0])
                elif known is None and not self._lookup.tiers and not pace.slow:
                    # storage that answers at once (the page cache): read in this thread, in turn, timed
                    samples = self._load_plain(keys, seeds, worker_id, pace=pace)
                else:
                    samples = self._load_ahead(keys, worker_id, known[0] if known is not None else None)
            else:
                known = self._lookup.peek_memory(keys)  # the MinIO cache asked once for the whole batch
                samples = self._load_plain(
                    keys, seeds, worker_id, raws=known[0] if known is not None else None
                )
            # Transforms write each sample's tensor straight into its row of the slot (output_buffers).
            with lend(stacker.take if stacker is not None else None):
                for sample in samples:
                    if sample is SKIPPED:
                        n_skipped += 1
                        continue
                    n_kept += 1
                    if stacker is None:
                        kept.append(sample)
                        continue
                    rest = stacker.add(sample)
                    if rest is not None:  # did not fit the slot's layout: plain samples from here on
                        kept, stacker = rest, None
        except BaseException:
            if stacker is not None:
                stacker.abort()  # the slot goes back to the ring
            raise
        finally:
            self._lookup.end_batch()
            if worker_id is not None:
                watch = self.watch
                assert watch is not None  # worker_id is set only with a watch (above)
                watch.idle(worker_id)
        self.counters.add_many({"items_loaded": n_kept, "skipped_items": n_skipped})
        return stacker.finish() if stacker is not None else kept

    def _load_batched(self, indices: Sequence[int], worker_id: int | None) -> Any:
        """The dataset's ``__getitems__`` for the whole batch (its random draws follow the first item's
        seed), or None: with ``on_error="skip"`` a batch whose call raised CorruptItemError is loaded item
        by item, so that only the bad items are dropped."""
        batched = self._keys.batched
        assert batched is not None  # _get_many calls this only when the dataset has a batched read
        keys = [int(i) for i in indices]
        if keys:
            self._seed(keys[0])
            if worker_id is not None:
                watch = self.watch
                assert watch is not None  # _get_many sets worker_id only with a watch
                watch.on_item(worker_id, keys[0])
        try:
            return batched(keys)
        except CorruptItemError:
            if self.on_error != "skip":
                raise
            return None

    # -- prep --------------------------------------------------------------------------------------

    def _seed(self, index: int) -> None:
        """Seed torch's RNG for ``index``'s prep when its index carried a seed (resumable epochs)."""
        seed = self._item_seeds.get(index) if self._item_seeds else None
        if seed is not None:
            # The CPU generator only: torch.manual_seed also queues a seed for every accelerator
            # backend, formatting the call stack each time it is not initialised (0.5 ms per item,
            # a fifth of a sample's prep; measured in bench_loader's prep-bound run).
            torch.default_generator.manual_seed(seed)

    def _load_plain(
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
        ahead (:meth:`_load_ahead`).
        """
        views = self._ahead.prep_views
        if raws is None and pace is None and type(self.source) is OpaqueSource and not self._lookup.tiers:
            # A dataset run as one stage fetches b"" (nothing to time, cache or copy): its reads are counted.
            self._lookup.count_reads(len(keys))
            raws, views = [b""] * len(keys), True
        fetch = (
            self._lookup.batch_fetch(views, asked=raws is not None) if raws is None or None in raws else None
        )
        prep, skip = self.source.prep, self._skips.skip_or_raise
        watch = self.watch
        on_item = (
            functools.partial(watch.on_item, worker_id)
            if worker_id is not None and watch is not None
            else None
        )
        reseed = torch.default_generator.manual_seed  # the CPU generator only: see _seed
        for k, index in enumerate(keys):
            if pace is not None and pace.slow:
                yield from self._load_ahead(keys[k:], worker_id)
                return
            if on_item is not None:
                on_item(index)
            try:
                raw = raws[k] if raws is not None else None
                if raw is None:
                    assert fetch is not None  # made whenever an item has no bytes in hand
                    raw = fetch(index) if pace is None else pace.timed_call(fetch, index)
                elif not views:
                    raw = as_bytes(raw)
                if seeds is not None and (seed := seeds[k]) is not None:
                    reseed(seed)
                sample = prep(raw, index)
            except CorruptItemError as e:
                sample = skip(e, index)
            yield sample

    def _load_ahead(
        self, indices: list[int], worker_id: int | None, known: list[Any] | None = None
    ) -> Iterator[Any]:
        """Prep each item while background threads read the next ``fetch_ahead`` ones (:mod:`.ahead`)."""
        return self._ahead.load(
            indices, worker_id, self.watch, self._seed, self._skips.skip_or_raise, known=known
        )

    def _load_split(self, indices: Sequence[int], worker_id: int | None) -> Iterator[Any]:
        indices = [int(i) for i in indices]
        arrays = self.sample_cache_tier.get_many(indices)
        self._lookup.ask_batched([i for i in indices if i not in arrays])
        fresh = {}
        for index in indices:
            if worker_id is not None:
                watch = self.watch
                assert watch is not None  # _get_many sets worker_id only with a watch
                watch.on_item(worker_id, index)
            try:
                arr = arrays.get(index)
                if arr is None:
                    arr = self.source.prep_deterministic(self.fetch(index), index)
                    fresh[index] = arr
                self._seed(index)
                sample = self.source.prep_random(arr, index)
            except CorruptItemError as e:
                sample = self._skips.skip_or_raise(e, index)
            yield sample
        if fresh:
            self.sample_cache_tier.put_many(fresh)

    def close(self) -> None:
        """Free the skip log (the loader closes its counters, cache and worker table itself)."""
        self._skips.close()

    def stats(self) -> dict[str, Any]:
        """Counters summed over all processes, plus each tier's own stats."""
        out: dict[str, Any] = dict(self.counters.snapshot())
        for tier in self.tiers:
            out.update(tier.stats())
        return out

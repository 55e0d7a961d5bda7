"""The per-item path inside a loader worker: fetch through a chain of tiers, then prep.

``LoaderSource`` is the map-style torch ``Dataset`` that ``coordl.DataLoader`` hands to
``torch.utils.data.DataLoader``; torch's fetcher calls its batched ``__getitems__``. It frames the
batch (seeds, its number in the epoch, the ring slot, the counts) and has :mod:`coordl.fetch.loads`
load its items: for each index the fetch tiers are asked in order (MinIO cache, later a peer's cache),
then ``source.fetch`` (storage), the bytes offered to the tiers that missed (:mod:`coordl.fetch.tiers`),
and prepped, with the next items' reads in flight ahead of the prep (:mod:`coordl.fetch.ahead`).
Optionally the deterministic part of prep is looked up in / stored to a sample cache (memcache) first.

What torch would hand the dataset, the dataset gets (:mod:`coordl.fetch.keys`): a key that is not an
item index goes to ``dataset[key]`` as it is, and a dataset run as one opaque stage that defines
``__getitems__`` gets each batch in one call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch.utils.data

from coordl.datasets.source import describe_item, is_index
from coordl.errors import CorruptItemError
from coordl.fetch.keys import DatasetKeys
from coordl.fetch.loads import BatchLoads
from coordl.fetch.pagecache import check_mode
from coordl.fetch.skipping import SKIPPED, SkipLog
from coordl.fetch.tiers import BASE_COUNTERS, FetchTier, MinioTier, TierLookup
from coordl.fetch.watch import WorkerWatch
from coordl.resume.order import SeededIndex
from coordl.resume.workers import PAD, note_batch
from coordl.ring.output_buffers import lend
from shmem.counters import SharedCounters

__all__ = ["FetchTier", "MinioTier", "LoaderSource", "BASE_COUNTERS"]

_INDEX_TYPES = frozenset({int, SeededIndex})


class LoaderSource(torch.utils.data.Dataset):
    """A torch Dataset running fetch tiers -> storage -> prep for an item source.

    It frames each batch (its keys, its number in the epoch, the ring slot its samples are stacked
    into, its counts); the items' own chain (bytes, seed, prep) is :class:`coordl.fetch.loads.BatchLoads`.

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
        self.fetch_ahead = int(fetch_ahead)
        self._keys = DatasetKeys(source, counters, on_error)  # keys that are not indices; __getitems__
        self._skips = SkipLog(source, on_error)  # the items dropped with on_error="skip", logged once
        self._loads = BatchLoads(
            source, self._lookup, self._keys, self._skips, on_error=on_error,
            sample_cache_tier=sample_cache_tier, watch=watch, fetch_ahead=self.fetch_ahead,
        )  # fmt: skip

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
        loads = self._loads
        seeds = loads.seeds(indices)
        # The first index may carry the batch's number in its epoch (handed out of order: the resumable
        # state names it).
        if (number := getattr(indices[0] if indices else None, "batch", None)) is not None:
            note_batch(number)
        batched = loads.batched(indices, worker_id) if self._keys.batched is not None and stack else None
        # The dataset's own batch: collate gets it as is.
        if batched is not None and type(batched) is not list:
            self.counters.add("items_loaded", len(indices))
            return batched
        stacker = self.ring.stacker(len(indices)) if stack and self.ring is not None else None
        kept: list[Any] = []
        n_kept = n_skipped = 0
        try:
            samples: Any = (
                iter(batched)
                if batched is not None
                else loads.samples([int(i) for i in indices], seeds, worker is not None, worker_id)
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

    def close(self) -> None:
        """Free the skip log (the loader closes its counters, cache and worker table itself)."""
        self._skips.close()

    def stats(self) -> dict[str, Any]:
        """Counters summed over all processes, plus each tier's own stats."""
        out: dict[str, Any] = dict(self.counters.snapshot())
        for tier in self.tiers:
            out.update(tier.stats())
        return out

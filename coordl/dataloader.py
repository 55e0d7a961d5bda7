"""``coordl.DataLoader``: a drop-in ``torch.utils.data.DataLoader`` with a MinIO cache of raw items.

It is a ``torch.utils.data.DataLoader`` (so Lightning and Accelerate shard it as theirs, docs/frameworks.md)
whose attributes are torch's for the user's arguments, ``dataset`` read through coordl's tiers
(:mod:`coordl.fetch.view`); epochs run through a torch loader inside, so samplers, workers, pinning,
timeouts and persistent workers behave exactly as in torch. It adds:

* ``cache_bytes``: raw fetched bytes of items stay in shared memory for all workers, filled once and
  never evicted, so from the second epoch the hit ratio equals the cached fraction (:mod:`coordl.fetch.minio`);
* ``on_error="skip"``: items whose files are corrupt are dropped, logged and counted, never zero-filled;
* ``batch_ring``: workers collate into reused shared-memory slots, not fresh memory per batch
  (:mod:`coordl.ring.reader`);
* a worker that dies raises :class:`~coordl.errors.WorkerDiedError` naming the item it was on;
* ``stats()`` / ``epoch_stats()``: hits, misses and bytes read from storage, summed over all workers.

Why this module is long: the one class users import carries torch's whole DataLoader surface (17
arguments, settings kept in step with the inner loader) and coordl's additions, resume and stats; the
work itself lives in coordl.fetch, coordl.ring, coordl.workers, coordl.resume and coordl.sharding.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch.utils.data
from torch.utils.data.dataloader import default_collate

from coordl.coordinated.loader import join_for_loader
from coordl.datasets.adapt import as_item_source
from coordl.datasets.source import is_item_source
from coordl.epoch import EpochIterator, EpochStats, LoaderStats, Sized, SkipAwareCollate
from coordl.fetch.chain import FetchChain
from coordl.fetch.pipeline import BASE_COUNTERS, FetchTier, LoaderSource
from coordl.fetch.sample_cache import COUNTER_NAMES as SAMPLE_CACHE_COUNTERS
from coordl.fetch.sample_cache import SampleCacheTier
from coordl.fetch.view import DatasetView, unwrap_view
from coordl.fetch.watch import WorkerWatch, translate_torch_error
from coordl.options import check_dataset_options, validate_options
from coordl.partitioned.options import PartitionedOptions, check_partitioned
from coordl.partitioned.ownership import NodeTopology, PartitionedSampler
from coordl.remote.dispatch import attach as attach_remote
from coordl.resume import Resume, torch_iterator
from coordl.resume.face import ResumableLoader
from coordl.ring.reader import BatchRing
from coordl.sharding import unsharded_warning
from coordl.shutdown import stop_workers
from coordl.tune.face import TunableLoader
from coordl.tune.tuner import TuneOptions
from coordl.workers.start import forks_workers, start_workers
from shmem.counters import SharedCounters

__all__ = ["DataLoader"]

# Reads in flight per worker by default: enough to hide a local disk's or NFS server's latency behind
# prep; each holds one raw item.
DEFAULT_FETCH_AHEAD = 4

T_co = TypeVar("T_co", covariant=True)


class _LoaderParts(LoaderStats):
    """The parts a :class:`DataLoader` composes, apart from iterating them: building the fetch side,
    what profilers change between epochs (workers, fetch tiers), the settings kept in step with the
    inner torch loader, the workers' errors, the statistics, and closing.

    A base of :class:`DataLoader` (it reads the attributes ``DataLoader.__init__`` sets)."""

    # Set by DataLoader.__init__ (described there) or torch's DataLoader: declared here, where they are read.
    cache_bytes: int
    partitioned: bool | PartitionedOptions
    prefetch_factor: int | None
    _iterable: bool
    _source: Any
    _chain: FetchChain | None
    _sample_cache_tier: SampleCacheTier | None
    _view: DatasetView | None
    _watch: WorkerWatch | None
    _ring: BatchRing | None
    _inner: LoaderSource | None
    _member: Any
    _resume: Resume | None
    _torch: torch.utils.data.DataLoader | None
    _remote: Any
    _pass_batches: int
    _pass_length: int | None

    # -- construction steps ------------------------------------------------------------------------

    def _build_fetch_side(self, dataset: Any, options: dict[str, Any]) -> None:
        """Source, counters, fetch chain, sample cache tier and the public view of ``dataset``."""
        sample_cache, on_error = options["sample_cache"], options["on_error"]
        self._source = None if self._iterable else _adapt(dataset)
        check_dataset_options(
            dataset, self.source, cache_bytes=self.cache_bytes, sample_cache=sample_cache, on_error=on_error
        )
        self._counters = SharedCounters(
            list(BASE_COUNTERS) + (list(SAMPLE_CACHE_COUNTERS) if sample_cache is not None else [])
        )
        self._chain = self._sample_cache_tier = self._view = None
        if self._iterable:
            return
        self._chain = FetchChain(
            self.source, self._counters, cache_bytes=self.cache_bytes, cache_dir=options["cache_dir"],
            partitioned=options["partitioned"], name=type(dataset).__name__,
        )  # fmt: skip
        if sample_cache is not None:
            self._sample_cache_tier = SampleCacheTier(sample_cache, self.source, self._counters)
        self._view = DatasetView(
            dataset, self.source, self._chain.tiers, self._counters, on_error=on_error,
            sample_cache_tier=self._sample_cache_tier, fetch_ahead=self._fetch_ahead(options["fetch_ahead"]),
            page_cache=options["page_cache"],
        )  # fmt: skip
        self._view.loader_options, self._view.chain, self._view.owner = (
            options,
            self._chain,
            weakref.ref(self),
        )

    @property
    def source(self) -> Any:
        """The item source coordl reads (the dataset, or its adapter). A property, not an instance
        attribute: Lightning and Ignite rebuild a loader from its instance attributes."""
        return self._source

    def _take_over(self, view: DatasetView) -> None:
        """Read through ``view``'s fetch side (a framework rebuilt the loader it belongs to) and close it at the end."""
        self._source, self._counters, self._chain, self._view = view.source, view.counters, view.chain, view
        self._sample_cache_tier = view.sample_cache_tier
        view.owner = weakref.ref(self)

    def _partitioned_sampler(self, sampler: Any, batch_sampler: Any, shuffle: bool | None) -> Any:
        """The user's sampler, or with ``partitioned=True`` and none given, this rank's shard sampler."""
        if not self.partitioned or sampler is not None or batch_sampler is not None:
            return sampler
        # a fresh random shard per rank and epoch, the same number of batches on every rank
        topo = NodeTopology.from_env()
        return PartitionedSampler(len(self.source), topo.world_size, topo.rank, shuffle=bool(shuffle))

    def _new_loader_source(self, reads: dict[str, Any]) -> LoaderSource:
        """What coordl's inner torch loader reads for a map-style dataset: the fetch tiers, then prep."""
        assert self._chain is not None  # every map-style dataset's fetch side has one (_build_fetch_side)
        return LoaderSource(
            self.source, self._chain.tiers, self._counters, watch=self._watch,
            ring=self._ring.collate if self._ring is not None else None, **reads,
        )  # fmt: skip

    def _built_torch(self) -> torch.utils.data.DataLoader:
        """The inner torch loader (``DataLoader.__init__`` made it, or raised)."""
        assert self._torch is not None
        return self._torch

    def _fetch_ahead(self, fetch_ahead: int | None) -> int:
        if fetch_ahead is not None:
            return fetch_ahead
        return DEFAULT_FETCH_AHEAD if getattr(self.source, "thread_safe_fetch", False) is True else 0

    # -- what profilers may change between epochs --------------------------------------------------

    @property
    def num_workers(self) -> int:
        """Worker processes per epoch. Settable between epochs (takes effect at the next ``iter``)."""
        return self.__dict__.get("num_workers", 0)

    @num_workers.setter
    def num_workers(self, workers: int) -> None:
        # Kept in the instance dict under its own name: frameworks rebuild a loader from vars(loader).
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
            raise ValueError(f"num_workers must be an int >= 0, got {workers!r}")
        watch = self.__dict__.get("_watch")
        if watch is not None and workers > watch.num_workers:
            raise ValueError(
                f"num_workers={workers}: this loader's worker table has {watch.num_workers} rows"
            )
        self.__dict__["num_workers"] = workers
        inner = self.__dict__.get("_torch")
        if inner is None:  # torch's __init__ setting it: nothing built yet
            return
        for loader in (self, inner):
            if workers > 0 and loader.prefetch_factor is None:
                loader.prefetch_factor = 2  # torch's default, which it leaves unset without workers
        inner.num_workers = workers

    def add_fetch_tier(self, tier: FetchTier) -> None:
        """Ask ``tier`` for raw bytes before every other tier, from the next epoch's workers on.

        For tools that change where a job's reads come from (``dsanalyzer`` serves them from memory to
        measure prep alone). ``tier`` follows :class:`coordl.fetch.pipeline.FetchTier`.
        """
        inner, view = self._inner, self._view
        if inner is None:
            raise ValueError("add_fetch_tier needs a map-style dataset (an IterableDataset has no fetch)")
        assert view is not None  # a map-style dataset's fetch side has both (DataLoader.__init__)
        inner.tiers.insert(0, tier)
        view.tiers.insert(0, tier)

    def remove_fetch_tier(self, tier: FetchTier) -> None:
        """Undo :meth:`add_fetch_tier` (a tier that was not added is ignored)."""
        for reader in (self._inner, self._view):
            if reader is not None and tier in reader.tiers:
                reader.tiers.remove(tier)

    # -- stats -------------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Totals since construction (or :meth:`reset_stats`), counted across all workers.

        Keys: ``cache_hits``, ``cache_misses``, ``storage_bytes_read``, ``storage_items_read``,
        ``items_loaded``, ``skipped_items``, ``cached_items``, ``cached_bytes``, ``capacity_bytes``,
        ``cache_backend``, plus the dataset's own ``stats()`` and each fetch tier's; with the batch
        ring, ``ring_batches`` (batches handed out from it), ``ring_stacked`` (of those, stacked sample
        by sample as the worker made them), ``ring_in_place`` (samples a transform wrote straight into
        their batch row, see :mod:`coordl.ring.output_buffers`), ``ring_fallbacks`` (collated by torch
        instead), ``ring_slots`` (distinct slots used) and ``ring_adopted`` (rings a later epoch's
        workers took over).
        """
        return super().stats()

    def _stat_parts(self) -> tuple[Any, ...]:
        return (self._chain, self._sample_cache_tier, self._ring, self._remote)

    # -- lifetime ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop persistent workers and free the shared memory now (also done at interpreter exit)."""
        if self._closed:
            return
        # (after a loader that took over this one's fetch side closed it, there is nothing left to count)
        self._final_stats = {} if self._view is not None and self._view.closed else self.stats()
        self._closed = True
        self._free()

    def _free(self) -> None:
        """Stop the workers, then free every part built so far (also after a failed ``__init__``)."""
        stop_workers(getattr(self._torch, "_iterator", None))
        if self._torch is not None:
            self._torch._iterator = None
        owner = self._view is None or self._view.owner() is self  # else a loader took over the fetch side
        shared = (self._chain, self._counters, self._view) if owner else ()
        for obj in (self._member, *shared, self._watch, self._inner, self._ring, self._remote):
            if obj is not None:
                obj.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Settings torch reads when an epoch starts, which users (and Lightning) may set on the loader.
    _FOLLOWED = (
        "timeout",
        "worker_init_fn",
        "pin_memory",
        "pin_memory_device",
        "in_order",
        "multiprocessing_context",
    )

    def _follow_settings(self) -> None:
        """Give coordl's inner torch loader what was set on this one since the last epoch."""
        for name in self._FOLLOWED:
            value = getattr(self, name)
            if getattr(self._torch, name) is not value:
                setattr(self._torch, name, value)

    def _translate(self, error: Exception, torch_iter: Any) -> BaseException | None:
        """A coordl error for torch's worker-death and timeout RuntimeErrors (and a data queue's
        ConnectionError or EOFError at a worker's death), else None."""
        return translate_torch_error(error, torch_iterator(torch_iter), self._watch, self.source)

    def _returned(self) -> None:
        """One more batch handed out. The epoch's last closes its statistics: Lightning and Accelerate stop
        after ``len(loader)`` batches and never ask for the StopIteration that would close them."""
        self._pass_batches += 1
        if self._pass_batches == self._pass_length:
            self._end_epoch()

    def _end_epoch(self) -> None:
        if self._chain is not None:  # items read from storage reach their owners first (partitioned=)
            self._chain.end_epoch()
        self._epoch_stats.end(self._counters.snapshot(), complete=True)

    def _abandon_epoch(self, torch_iter: Any) -> None:
        """An error ended the epoch: stop its workers now and make the next epoch start fresh ones.

        Left alone, they would idle for as long as anything holds the traceback (a dead worker's
        siblings included), then stall whichever later allocation makes the collector shut them down.
        """
        torch_iter = torch_iterator(torch_iter)
        stop_workers(torch_iter)
        if self._torch is not None and getattr(self._torch, "_iterator", None) is torch_iter:
            self._torch._iterator = None


class DataLoader(
    torch.utils.data.DataLoader[T_co], _LoaderParts, ResumableLoader, LoaderStats, TunableLoader
):
    """Iterate batches of a dataset, like ``torch.utils.data.DataLoader``, through a MinIO cache.

    Every torch argument keeps its torch meaning. The additions:

    Args:
        cache_bytes: bytes of shared memory for the MinIO cache of raw items (0: no cache). Items are
            cached as first fetched until the budget is full and never evicted.
        cache_dir: directory for a file-backed cache when ``/dev/shm`` is too small (default: a
            ``coordl`` directory under the system temp dir). Setting it forces the file-backed cache.
        on_error: "raise" (default): a corrupt item raises :class:`CorruptItemError` naming its file;
            "skip": drop it from its batch, log it once and count it in ``stats()["skipped_items"]``.
        sample_cache: a memcache store for the deterministic part of prep (needs a split-prep source).
        partitioned: share the cache across the nodes of a distributed job (:mod:`coordl.partitioned`):
            True, or a :class:`coordl.PartitionedOptions` (``tls=True``: the nodes' Redis over TLS).
        coordinate: coordinated prep across jobs on one server (:mod:`coordl.coordinated`).
        batch_ring: with workers and torch's default collate, each worker stacks batches into a
            ring of reused shared-memory slots and the batch's tensors view the slot (no copy); a
            slot is reused once the batch's tensors are freed. ``"copy"``: hand out private copies
            instead (the slot is reused at once). False: torch's collate into fresh shared memory.
        fetch_ahead: in each worker, how many items of its batch background threads fetch ahead
            while it preps, so its core does not idle during storage reads. Default (None):
            :data:`DEFAULT_FETCH_AHEAD` for sources that declare ``thread_safe_fetch = True``
            (``coordl.ImageFolder``, ``FileListDataset``), else 0 (fetch and prep in turn). Set it
            only for a source whose ``fetch`` may run in several threads at once.
        page_cache: whether storage reads go through the OS page cache. ``"auto"`` (default): past it
            (``O_DIRECT``) when the dataset's bytes outside the MinIO cache exceed the memory left for
            the page cache, so that reads the page cache could not keep until the next epoch cost no
            insertion and reclaim; ``"use"``: always through it (torch's behaviour); ``"bypass"``:
            always past it. Needs a source with ``fetch_uncached`` (``coordl.ImageFolder``,
            ``FileListDataset``, torchvision's ImageFolder); see :mod:`coordl.fetch.pagecache`.
        snapshot_every_n_steps: accepted as torchdata's ``StatefulDataLoader`` takes it; coordl keeps
            the state of every batch handed out at no cost, so a state never needs replaying and any
            value behaves as 1 (``state_dict()`` is exact at every step).
        remote_prep: a :class:`coordl.RemotePrep`: batches prepped on a Ray cluster too (docs/remote_prep.md).
        tune: True (or a :class:`coordl.TuneOptions`): measure each epoch and change ``num_workers``,
            ``prefetch_factor`` and the main process's intra-op threads between epochs, keeping only a change
            that measured faster; ``tune_log()`` lists each change (:mod:`coordl.tune`, docs/dataloader.md).
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Callable | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        cache_bytes: int = 0,
        cache_dir: str | None = None,
        on_error: str = "raise",
        sample_cache: Any = None,
        partitioned: bool | PartitionedOptions = False,
        coordinate: Any = None,
        batch_ring: bool | str = True,
        fetch_ahead: int | None = None,
        page_cache: str = "auto",
        snapshot_every_n_steps: int | None = 1,
        remote_prep: Any = None,
        tune: bool | TuneOptions = False,
    ) -> None:
        """Why this function is long: the signature is torch's 17 arguments (kept exactly) and coordl's 9;
        the body composes the parts in order, one statement per part, each complete when built."""
        given = dataset
        self.snapshot_every_n_steps = snapshot_every_n_steps  # torchdata's argument (see Args)
        dataset, options = unwrap_view(dataset, {  # a framework rebuilding a loader from its attributes
            "cache_bytes": cache_bytes, "cache_dir": cache_dir, "on_error": on_error, "sample_cache": sample_cache,
            "partitioned": partitioned, "coordinate": coordinate, "batch_ring": batch_ring, "fetch_ahead": fetch_ahead,
            "page_cache": page_cache,
        })  # fmt: skip
        cache_bytes, cache_dir, on_error = options["cache_bytes"], options["cache_dir"], options["on_error"]
        sample_cache, partitioned, coordinate = (
            options["sample_cache"],
            options["partitioned"],
            options["coordinate"],
        )
        batch_ring, fetch_ahead, page_cache = (
            options["batch_ring"],
            options["fetch_ahead"],
            options["page_cache"],
        )
        self._closed = False
        self._final_stats: dict[str, Any] | None = None
        validate_options(
            cache_bytes, on_error, batch_size, batch_sampler, timeout, batch_ring, fetch_ahead, page_cache
        )
        check_partitioned(partitioned)
        # coordl's own arguments, public like torch's: frameworks rebuild a loader from its attributes
        self.cache_bytes = int(cache_bytes)
        self.cache_dir = cache_dir
        self.on_error = on_error
        self.partitioned = partitioned
        self.coordinate = coordinate
        self.sample_cache = sample_cache
        self.batch_ring = batch_ring
        self.fetch_ahead = fetch_ahead
        self.page_cache = page_cache
        self._iterable = isinstance(dataset, torch.utils.data.IterableDataset)
        self._epoch_stats = EpochStats(BASE_COUNTERS)
        # A framework rebuilding a loader hands the old one's view, as dataset or in the sampler it made on it.
        old = [v for v in (given, getattr(sampler, "dataset", None)) if isinstance(v, DatasetView)]
        old = [v for v in old if v.dataset is dataset and v.reusable(options)]
        if old:
            self._take_over(old[0])
        else:
            self._build_fetch_side(dataset, options)
        self._watch = WorkerWatch(num_workers) if num_workers > 0 and not self._iterable else None
        reads: dict[str, Any] = {
            "on_error": on_error, "sample_cache_tier": self._sample_cache_tier,
            "fetch_ahead": self._fetch_ahead(fetch_ahead), "page_cache": page_cache,
        }  # fmt: skip
        self._ring = self._inner = self._member = self._resume = self._torch = self._remote = None
        self.remote_prep = remote_prep
        self._unsharded: dict[str, Any] | None = {  # checked at the first epoch (coordl.sharding)
            "user_sampler": sampler, "user_batch_sampler": batch_sampler, "partitioned": partitioned,
            "iterable": self._iterable or coordinate is not None,
        }  # fmt: skip
        # partitioned=True without a sampler: this rank's shard sampler, the one the public face shows
        shard = self._partitioned_sampler(sampler, batch_sampler, shuffle) if not self._iterable else sampler
        try:
            # The public face is torch's own: its checks and errors, its attributes for the user's arguments
            # (``dataset`` seen through coordl's tiers, see coordl.fetch.view), the frameworks read them.
            # By keyword: a framework that recorded this call (not coordl's) replaces arguments, never repeats one.
            super().__init__(
                dataset=dataset if self._view is None else self._view, batch_size=batch_size,
                shuffle=shuffle if shard is sampler else None, sampler=shard, batch_sampler=batch_sampler, num_workers=num_workers, collate_fn=collate_fn,
                pin_memory=pin_memory, drop_last=drop_last, timeout=timeout, worker_init_fn=worker_init_fn,
                multiprocessing_context=multiprocessing_context, generator=generator,
                prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                pin_memory_device=pin_memory_device, in_order=in_order,
            )  # fmt: skip
            default = collate_fn is None or collate_fn is default_collate
            auto_collation = batch_size is not None or batch_sampler is not None
            use_ring = batch_ring and default and num_workers > 0 and auto_collation and coordinate is None
            self._ring = (
                BatchRing(prefetch_factor, batch_size, copy=batch_ring == "copy") if use_ring else None
            )
            if self._ring is not None:
                collate_fn = self._ring.collate
            self._inner = None if self._iterable else self._new_loader_source(reads)
            if on_error == "skip":
                collate_fn = SkipAwareCollate(collate_fn or default_collate)
            inner = dataset if self._inner is None else self._inner
            self._member = None if coordinate is None else join_for_loader(
                coordinate, dataset=inner, collate_fn=collate_fn or default_collate, batch_size=batch_size,
                shuffle=shuffle, drop_last=drop_last, sampler=sampler, batch_sampler=batch_sampler,
                num_workers=num_workers, mp_context=multiprocessing_context,
            )  # fmt: skip
            # torch's default sampler (made above, with the user's generator) is the one that orders the epochs
            order = shard
            if order is None and batch_sampler is None:
                order = self.sampler
            self._resume = None if self._member is not None else Resume(
                inner, user_dataset=dataset, sampler=order, batch_sampler=batch_sampler, shuffle=shuffle,
                batch_size=batch_size, generator=generator, iterable=self._iterable, drop_last=drop_last,
            )  # fmt: skip
            if self._resume is not None:  # torch's own order, wrapped so that an epoch can resume
                sampler, batch_sampler, shuffle = self._resume.torch_arguments()
                inner, collate_fn = self._resume.for_torch(inner, collate_fn)  # workers report their state
            self._torch = torch.utils.data.DataLoader(
                inner, batch_size=batch_size, shuffle=shuffle, sampler=sampler, batch_sampler=batch_sampler,
                num_workers=num_workers, collate_fn=collate_fn, pin_memory=pin_memory, drop_last=drop_last,
                timeout=timeout, worker_init_fn=worker_init_fn, multiprocessing_context=multiprocessing_context,
                generator=generator, prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                pin_memory_device=pin_memory_device, in_order=in_order,
            )  # fmt: skip
            self._remote = attach_remote(remote_prep, self)  # coordl.remote: batches prepped on Ray too
            self._start_tuning(tune)
        except BaseException:
            self._free()
            raise

    # -- iteration ---------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # torch's says its _BaseDataLoaderIter
        if self._closed:
            raise RuntimeError("this coordl.DataLoader was closed")
        if self._unsharded is not None:
            message, self._unsharded = unsharded_warning(**self._unsharded), None
            if message is not None:
                warnings.warn(message, RuntimeWarning, stacklevel=2)
        self._epoch_stats.end(self._counters.snapshot(), complete=False)
        self._epoch_stats.begin(self._counters.snapshot())
        clock = self._tuning_epoch()  # tune=: its next change applied now
        # torch warns about an IterableDataset yielding more than len() only once the user asked len():
        # this internal len() must not arm that warning.
        asked = getattr(self._torch, "_IterableDataset_len_called", None)
        self._pass_batches, self._pass_length = 0, _sized_len(self)
        if self._torch is not None:
            self._torch._IterableDataset_len_called = asked
        if self._member is not None:  # coordinated: the group's batches, prepped once for all jobs
            it: Any = Sized(self._member.epoch(), len(self._member))
        else:
            torch_loader = self._built_torch()
            self._follow_settings()
            if self._ring is not None and forks_workers(torch_loader):
                self._ring.offer_segments(torch_loader.num_workers)
            start = start_workers if self._remote is None else self._remote.wrap(start_workers)
            try:
                it = start(torch_loader) if self._resume is None else self._resume.start(
                    torch_loader, start, release=self._ring.unwrap if self._ring is not None else None,
                    turns=self._remote is None,
                )  # fmt: skip
            except RuntimeError as error:  # a worker died at its start: torch's SIGCHLD handler raised it
                if (translated := self._translate(error, None)) is None:
                    raise
                raise translated from error
            if self._ring is not None:
                self._ring.start_epoch(torch_iterator(it))
            if self._resume is not None:  # a resumed pass hands out the batches that were left
                self._pass_batches = int(getattr(self._resume, "pass_offset", 0))
        epoch = EpochIterator(
            it,
            translate=self._translate,
            unwrap=self._ring.unwrap if self._ring is not None else (lambda batch: batch),
            on_end=self._end_epoch,
            on_batch=self._returned,  # the resumable state sees each batch itself (coordl.resume.PassTracker)
            on_error=self._abandon_epoch,
        )
        return self._tuned(epoch, clock)

    def __len__(self) -> int:
        return len(self._member) if self._member is not None else len(self._built_torch())

    def __setattr__(self, name: str, value: Any) -> None:
        # coordl's own state (private names) skips torch's guard of its public attributes, and so any
        # record a framework keeps of what was set after __init__: Lightning replays that record on the
        # loader it rebuilds, which must keep its own parts, not this loader's.
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def __repr__(self) -> str:
        cache = f", cache={self._chain.minio!r}" if self._chain is not None and self._chain.minio else ""
        return f"coordl.DataLoader({type(unwrap_view(self.dataset)[0]).__name__}, batch_size={self.batch_size}{cache})"


def _sized_len(obj: Any) -> int | None:
    try:
        return len(obj)
    except TypeError:  # an IterableDataset without __len__
        return None


def _adapt(dataset: Any) -> Any:
    """The item source for ``dataset``: itself, or ``coordl.datasets.adapt.as_item_source``'s adapter."""
    return dataset if is_item_source(dataset) else as_item_source(dataset)

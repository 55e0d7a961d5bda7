"""``coordl.DataLoader``: a drop-in ``torch.utils.data.DataLoader`` with a MinIO cache of raw items.

It takes torch's arguments with torch's meaning (it builds a torch DataLoader inside, so samplers,
workers, pinning, timeouts and persistent workers behave exactly as in torch) and adds:

* ``cache_bytes``: raw fetched bytes of items stay in shared memory for all workers, filled once and
  never evicted, so from the second epoch the hit ratio equals the cached fraction (:mod:`coordl.minio`);
* ``on_error="skip"``: items whose files are corrupt are dropped, logged and counted, never zero-filled;
* ``batch_ring``: workers collate into reused shared-memory slots, not fresh memory per batch
  (:mod:`coordl.batch_ring`);
* a worker that dies raises :class:`~coordl.errors.WorkerDiedError` naming the item it was on;
* ``stats()`` / ``epoch_stats()``: hits, misses and bytes read from storage, summed over all workers.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any

import torch.utils.data
from torch.utils.data.dataloader import default_collate

from coordl.batch_ring import BatchRing
from coordl.counters import SharedCounters
from coordl.datasets import as_item_source
from coordl.errors import CoordlTimeoutError
from coordl.minio import MinioCache
from coordl.pipeline import BASE_COUNTERS, EmptyBatch, FetchTier, LoaderSource, MinioTier
from coordl.source import has_split_prep, is_item_source
from coordl.worker_start import forks_workers, start_workers
from coordl.worker_watch import WorkerWatch, is_worker_death, worker_died_error

__all__ = ["DataLoader"]

_SAMPLE_CACHE_COUNTERS = ("sample_cache_hits", "sample_cache_misses", "sample_cache_errors")
_EPOCH_KEYS = BASE_COUNTERS


# Reads in flight per worker by default: enough to hide a local disk's or NFS server's latency behind
# prep; each holds one raw item.
DEFAULT_FETCH_AHEAD = 4


class DataLoader:
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
        partitioned: share the cache across the nodes of a distributed job (``coordl.partition``).
        coordinate: coordinated prep across jobs on one server (``coordl.coordinate``).
        batch_ring: with workers and torch's default collate, each worker stacks batches into a
            ring of reused shared-memory slots and the batch's tensors view the slot (no copy); a
            slot is reused once the batch's tensors are freed. ``"copy"``: hand out private copies
            instead (the slot is reused at once). False: torch's collate into fresh shared memory.
        fetch_ahead: in each worker, how many items of its batch background threads fetch ahead
            while it preps, so its core does not idle during storage reads. Default (None):
            :data:`DEFAULT_FETCH_AHEAD` for sources that declare ``thread_safe_fetch = True``
            (``coordl.ImageFolder``, ``FileListDataset``), else 0 (fetch and prep in turn). Set it
            only for a source whose ``fetch`` may run in several threads at once.
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
        partitioned: bool = False,
        coordinate: Any = None,
        batch_ring: bool | str = True,
        fetch_ahead: int | None = None,
    ) -> None:
        self._torch: torch.utils.data.DataLoader | None = None
        self._closed = False
        self._ring: BatchRing | None = None
        self._validate(cache_bytes, on_error, batch_size, batch_sampler, timeout)
        if batch_ring not in (True, False, "copy"):
            raise ValueError(f"batch_ring must be True, False or 'copy', got {batch_ring!r}")
        if fetch_ahead is not None and (not isinstance(fetch_ahead, int) or fetch_ahead < 0):
            raise ValueError(f"fetch_ahead must be an int >= 0 or None, got {fetch_ahead!r}")
        self.dataset = dataset
        self.cache_bytes = int(cache_bytes)
        self.cache_dir = cache_dir
        self.on_error = on_error
        self.partitioned = partitioned
        self.coordinate = coordinate
        self._require_optional("partitioned=True", "coordl.partition", partitioned)
        self._require_optional("coordinate=", "coordl.coordinate", coordinate is not None)
        self._iterable = isinstance(dataset, torch.utils.data.IterableDataset)
        self.source = None if self._iterable else _adapt(dataset)
        if sample_cache is not None and not has_split_prep(self.source):
            raise ValueError(
                f"sample_cache= needs a dataset whose prep is split into prep_deterministic/prep_random; "
                f"{type(dataset).__name__} has no such split (use coordl.ImageFolder or add the methods)"
            )
        if self._iterable and (cache_bytes or sample_cache is not None or on_error != "raise"):
            raise ValueError(
                "cache_bytes=, sample_cache= and on_error= need a map-style dataset; "
                f"{type(dataset).__name__} is an IterableDataset"
            )
        self.sample_cache = sample_cache
        self._counters = SharedCounters(self._counter_names())
        self._minio: MinioCache | None = None
        self._tiers = [] if self._iterable else self._build_fetch_tiers()
        self._watch = WorkerWatch(num_workers) if num_workers > 0 and not self._iterable else None
        self._epochs: list[dict[str, Any]] = []
        self._epoch_start: dict[str, int] | None = None
        self._final_stats: dict[str, Any] | None = None
        if self._iterable:
            inner = dataset
        else:
            inner = LoaderSource(
                self.source,
                self._tiers,
                self._counters,
                on_error=on_error,
                sample_cache_tier=self._build_sample_cache_tier(),
                watch=self._watch,
                fetch_ahead=self._fetch_ahead(fetch_ahead),
            )
        auto_collation = batch_size is not None or batch_sampler is not None
        if batch_ring and collate_fn is None and num_workers > 0 and auto_collation and coordinate is None:
            self._ring = BatchRing(prefetch_factor, batch_size, copy=batch_ring == "copy")
            collate_fn = self._ring.collate
            if isinstance(inner, LoaderSource):
                inner.ring = self._ring.collate
        if on_error == "skip":
            collate_fn = _SkipAwareCollate(collate_fn or default_collate)
        self._member = None
        if coordinate is not None:
            self._member = importlib.import_module("coordl.coordinate").join_for_loader(
                coordinate, dataset=inner, collate_fn=collate_fn or default_collate, batch_size=batch_size,
                shuffle=shuffle, drop_last=drop_last, sampler=sampler, batch_sampler=batch_sampler,
                num_workers=num_workers, mp_context=multiprocessing_context,
            )  # fmt: skip
        sampler, batch_sampler, shuffle = self._build_sampler(sampler, batch_sampler, shuffle)
        self._torch = torch.utils.data.DataLoader(
            inner,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            drop_last=drop_last,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            generator=generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
        )

    # -- construction steps (each in one method, so that other features extend one place) ----------

    def _fetch_ahead(self, fetch_ahead: int | None) -> int:
        if fetch_ahead is not None:
            return fetch_ahead
        return DEFAULT_FETCH_AHEAD if getattr(self.source, "thread_safe_fetch", False) is True else 0

    @staticmethod
    def _validate(cache_bytes: Any, on_error: str, batch_size: Any, batch_sampler: Any, timeout: Any) -> None:
        if not isinstance(cache_bytes, int) or isinstance(cache_bytes, bool) or cache_bytes < 0:
            raise ValueError(f"cache_bytes must be an int >= 0 (bytes), got {cache_bytes!r}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if on_error == "skip" and batch_size is None and batch_sampler is None:
            raise ValueError(
                "on_error='skip' needs batching: with batch_size=None a skipped item cannot be dropped"
            )
        if timeout < 0:
            raise ValueError(f"timeout must be >= 0 seconds, got {timeout!r}")

    @staticmethod
    def _require_optional(option: str, module: str, wanted: bool) -> None:
        if not wanted:
            return
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            raise NotImplementedError(f"{option} needs {module}, which this build of coordl lacks") from None

    def _counter_names(self) -> list[str]:
        names = list(BASE_COUNTERS)
        if self.sample_cache is not None:
            names += _SAMPLE_CACHE_COUNTERS
        return names

    def _build_fetch_tiers(self) -> list[FetchTier]:
        """The chain of places raw bytes come from before storage, nearest first."""
        tiers: list[FetchTier] = []
        if self.partitioned:  # each node caches its share; peers first
            return [importlib.import_module("coordl.partition").loader_tier(self)]
        # An opaque dataset has no raw bytes to cache (as_item_source already warned about it).
        if self.cache_bytes > 0 and not getattr(self.source, "opaque", False):
            self._minio = MinioCache(
                self.cache_bytes,
                len(self.source),
                directory=self.cache_dir,
                name=type(self.dataset).__name__,
            )
            tiers.append(MinioTier(self._minio, self._counters))
        return tiers

    def _build_sampler(self, sampler: Any, batch_sampler: Any, shuffle: bool | None) -> tuple[Any, Any, Any]:
        """The (sampler, batch_sampler, shuffle) handed to torch: the user's, unless partitioned."""
        if self.partitioned and sampler is None and batch_sampler is None and not self._iterable:
            # a fresh random shard per rank and epoch, the same number of batches on every rank
            return importlib.import_module("coordl.partition").loader_sampler(self, shuffle), None, None
        return sampler, batch_sampler, shuffle

    def _build_sample_cache_tier(self) -> Any:
        if self.sample_cache is None:
            return None
        sample_cache = importlib.import_module("coordl.sample_cache")
        return sample_cache.SampleCacheTier(self.sample_cache, self.source, self._counters)

    # -- iteration ---------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        if self._closed:
            raise RuntimeError("this coordl.DataLoader was closed")
        self._end_epoch(complete=False)
        self._epoch_start = self._counters.snapshot()
        if self._member is not None:  # coordinated: the group's batches, prepped once for all jobs
            return _EpochIterator(self, _Sized(self._member.epoch(), len(self._member)))
        if self._ring is not None and forks_workers(self._torch):
            self._ring.offer_segments(self._torch.num_workers)
        torch_iter = start_workers(self._torch)
        if self._ring is not None:
            self._ring.start_epoch(torch_iter)
        return _EpochIterator(self, torch_iter)

    def __len__(self) -> int:
        return len(self._member) if self._member is not None else len(self._torch)

    def _end_epoch(self, *, complete: bool) -> None:
        if self._epoch_start is None:
            return
        now = self._counters.snapshot()
        delta = {k: now[k] - self._epoch_start[k] for k in _EPOCH_KEYS}
        looked_up = delta["cache_hits"] + delta["cache_misses"]
        delta["hit_ratio"] = delta["cache_hits"] / looked_up if looked_up else 0.0
        delta["epoch"] = len(self._epochs)
        delta["complete"] = complete
        self._epochs.append(delta)
        self._epoch_start = None

    def _translate(self, error: RuntimeError, torch_iter: Any) -> BaseException | None:
        """A coordl error for torch's worker-death and timeout RuntimeErrors, else None."""
        if is_worker_death(error):
            workers = getattr(torch_iter, "_workers", [])
            exitcodes = {w.pid: w.exitcode for w in workers}
            # The iterator is broken after a death; make the next epoch start fresh workers.
            if getattr(self._torch, "_iterator", None) is torch_iter:
                self._torch._iterator = None
            return worker_died_error(error, self._watch, self.source, exitcodes)
        if "DataLoader timed out after" in str(error):
            return CoordlTimeoutError(f"{error} (the timeout= option of coordl.DataLoader)")
        return None

    # -- stats -------------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Totals since construction (or :meth:`reset_stats`), counted across all workers.

        Keys: ``cache_hits``, ``cache_misses``, ``storage_bytes_read``, ``storage_items_read``,
        ``items_loaded``, ``skipped_items``, ``cached_items``, ``cached_bytes``, ``capacity_bytes``,
        ``cache_backend``, plus the dataset's own ``stats()`` and each fetch tier's; with the batch
        ring, ``ring_batches`` (batches handed out from it), ``ring_stacked`` (of those, stacked sample
        by sample as the worker made them), ``ring_in_place`` (samples a transform wrote straight into
        their batch row, see :mod:`coordl.output_buffers`), ``ring_fallbacks`` (collated by torch
        instead), ``ring_slots`` (distinct slots used) and ``ring_adopted`` (rings a later epoch's
        workers took over).
        """
        if self._closed:
            return dict(self._final_stats or {})
        out: dict[str, Any] = {}
        for obj in (self.dataset, self.source):
            dataset_stats = getattr(obj, "stats", None)
            if callable(dataset_stats):
                out.update(dataset_stats())
        out.update(self._counters.snapshot())
        out.update({"cached_items": 0, "cached_bytes": 0, "capacity_bytes": 0, "cache_backend": "none"})
        for tier in self._tiers:
            out.update(tier.stats())
        sc = self._torch.dataset.sample_cache_tier if isinstance(self._torch.dataset, LoaderSource) else None
        if sc is not None and callable(getattr(sc, "stats", None)):
            out.update(sc.stats())
        if self._ring is not None:
            out.update(self._ring.stats())
        return out

    def epoch_stats(self) -> list[dict[str, Any]]:
        """Per epoch (one entry per iteration over the loader): the counter deltas and ``hit_ratio``."""
        return [dict(e) for e in self._epochs]

    def reset_stats(self) -> None:
        """Zero the counters and forget per-epoch numbers (call between epochs)."""
        self._counters.reset()
        self._epochs.clear()
        self._epoch_start = None

    # -- lifetime ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop persistent workers and free the shared memory now (also done at interpreter exit)."""
        if self._closed:
            return
        self._final_stats = self.stats()
        self._closed = True
        iterator = getattr(self._torch, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        self._torch._iterator = None
        for tier in self._tiers:  # e.g. stops the node's cache server
            if callable(getattr(tier, "close", None)):
                tier.close()
        inner = self._torch.dataset if isinstance(self._torch.dataset, LoaderSource) else None
        for obj in (self._member, self._minio, self._counters, self._watch, inner, self._ring):
            if obj is not None:
                obj.close()

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        # batch_size, sampler, batch_sampler, drop_last, generator, ...: torch's attributes.
        torch_loader = self.__dict__.get("_torch")
        if torch_loader is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(torch_loader, name)

    def __repr__(self) -> str:
        cache = f", cache={self._minio!r}" if self._minio is not None else ""
        return f"coordl.DataLoader({type(self.dataset).__name__}, batch_size={self._torch.batch_size}{cache})"


class _EpochIterator:
    """One pass over the loader: drops all-skipped batches, translates torch errors, closes the epoch."""

    def __init__(self, loader: DataLoader, torch_iter: Any) -> None:
        self._loader = loader
        self._it = torch_iter

    def __iter__(self) -> _EpochIterator:
        return self

    def __next__(self) -> Any:
        while True:
            try:
                batch = next(self._it)
            except StopIteration:
                self._loader._end_epoch(complete=True)
                raise
            except RuntimeError as e:
                translated = self._loader._translate(e, self._it)
                if translated is None:
                    raise
                raise translated from e
            if not isinstance(batch, EmptyBatch):
                ring = self._loader._ring
                return batch if ring is None else ring.unwrap(batch)

    def __len__(self) -> int:
        return len(self._it)


class _Sized:
    """An iterator with a length (the group's epoch generator, for ``len(iter(loader))``)."""

    def __init__(self, it: Iterator[Any], length: int) -> None:
        self._it, self._len = it, length

    def __iter__(self) -> _Sized:
        return self

    def __next__(self) -> Any:
        return next(self._it)

    def __len__(self) -> int:
        return self._len


class _SkipAwareCollate:
    """Collates what survived skipping; a batch with nothing left becomes :class:`EmptyBatch`."""

    def __init__(self, collate_fn: Callable) -> None:
        self.collate_fn = collate_fn

    def __call__(self, batch: list[Any]) -> Any:
        return self.collate_fn(batch) if batch else EmptyBatch()


def _adapt(dataset: Any) -> Any:
    """The item source for ``dataset``: itself, or ``coordl.datasets.as_item_source``'s adapter."""
    return dataset if is_item_source(dataset) else as_item_source(dataset)

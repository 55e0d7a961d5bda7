"""``NeighborLoader``: sampling-based GNN mini-batches, loaded ahead of the step (GLoader).

Each step of sampling-based GNN training samples a neighbourhood per seed (CPU), gathers the
features of every sampled node (memory- and storage-bound: the expensive part) and then computes.
Sampling/gathering and the model use different resources, so this loader overlaps them: up to
``pipeline_depth`` batches are sampled and gathered while the caller computes, in ``num_workers``
processes (``torch.utils.data`` workers, forked: the memory-mapped CSR and features are shared, never
copied) or, with ``num_workers=0``, in one background thread. A static cache of the hottest nodes'
features (:mod:`coordl.graph.cache`) cuts what is gathered from storage.

    loader = NeighborLoader(graph, seeds=train_idx, fanouts=[15, 10], batch_size=1024, shuffle=True,
                            num_workers=2, feature_cache_bytes=4 << 30, pipeline_depth=4, seed=0)
    for batch in loader:       # coordl.graph.Batch: seed_nodes, input_nodes, x, y, edges, blocks()
        ...
"""

from __future__ import annotations

import math
import os
import queue
import random
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, Sampler

from coordl.errors import CoordlTimeoutError, WorkerDiedError
from coordl.graph.batch import Batch
from coordl.graph.cache import FeatureCache
from coordl.graph.graph import Graph
from coordl.graph.maker import COUNTERS, BatchMaker
from coordl.shutdown import worker_death
from shmem.counters import SharedCounters
from shmem.segment import DEFAULT_DIR

__all__ = ["NeighborLoader"]


class _EpochKeys(Sampler):
    """Yields ``(epoch, b)`` for every batch of the epoch the loader is about to run."""

    def __init__(self, num_batches: int) -> None:
        self.num_batches, self.epoch = num_batches, 0

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return ((self.epoch, b) for b in range(self.num_batches))

    def __len__(self) -> int:
        return self.num_batches


def _identity(batch: Batch) -> Batch:
    return batch


def _check_args(
    graph: Graph,
    seeds: np.ndarray,
    fanouts: Sequence[int],
    batch_size: int,
    num_workers: int,
    pipeline_depth: int,
    feature_cache_bytes: int,
) -> None:
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a coordl.graph.Graph, got {type(graph).__name__}")
    if seeds.ndim != 1 or seeds.size == 0:
        raise ValueError(f"seeds must be a non-empty 1-D array of node ids, got shape {list(seeds.shape)}")
    if seeds.min() < 0 or seeds.max() >= graph.num_nodes:
        raise ValueError(f"seeds has node ids outside [0, {graph.num_nodes})")
    if np.unique(seeds).size != seeds.size:
        raise ValueError("seeds has repeated node ids: each training seed must appear once per epoch")
    if len(fanouts) == 0 or any(int(f) < -1 or int(f) == 0 for f in fanouts):
        raise ValueError(
            f"fanouts must be a non-empty list of positive ints (or -1 for all), got {list(fanouts)}"
        )
    for name, value, low in (
        ("batch_size", batch_size, 1),
        ("num_workers", num_workers, 0),
        ("pipeline_depth", pipeline_depth, 0),
        ("feature_cache_bytes", feature_cache_bytes, 0),
    ):
        if int(value) < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")
    if pipeline_depth == 0 and num_workers > 0:
        raise ValueError("pipeline_depth=0 (no loading ahead) needs num_workers=0: workers always load ahead")


class NeighborLoader:
    """Mini-batches of sampled neighbourhoods with their features, loaded ahead of compute.

    Args:
        graph: a :class:`~coordl.graph.Graph` (``Graph.load`` maps it from disk).
        seeds: training node ids (distinct); each appears exactly once per epoch.
        fanouts: neighbours sampled per node, per hop (``fanouts[0]`` for the seeds); -1 keeps all.
        batch_size: seeds per batch. shuffle: a new seed order every epoch (seeded by ``seed``).
        num_workers: processes that sample and gather; 0 uses one background thread (or the caller
            when ``pipeline_depth=0``).
        feature_cache_bytes: shared-memory budget for the features of the highest-out-degree nodes,
            filled as they are first read and never evicted (0: no cache, every row from the file).
        pipeline_depth: batches prepared ahead of the one being computed. It bounds memory (each is
            a full batch of features) and how long a storage hiccup can be hidden. With workers it is
            rounded up to a multiple of ``num_workers``; 0 loads each batch when it is asked for.
        drop_last: drop the last, partial batch.
        seed: seeds the epoch order and every batch's sampling: the same seed gives the same batches
            for any ``num_workers``. None: a random one.
        gather_features: False gives zeros for ``x`` (to time sampling alone; dsanalyzer uses it).
        cache_dir: where the cache segment lives (``/dev/shm`` by default).
        timeout_s: the longest wait for one batch before :class:`~coordl.errors.CoordlTimeoutError`.
    """

    def __init__(
        self,
        graph: Graph,
        seeds: Any,
        fanouts: Sequence[int],
        batch_size: int = 1,
        shuffle: bool = False,
        num_workers: int = 0,
        feature_cache_bytes: int = 0,
        pipeline_depth: int = 4,
        *,
        drop_last: bool = False,
        seed: int | None = None,
        gather_features: bool = True,
        cache_dir: str | os.PathLike = DEFAULT_DIR,
        timeout_s: float = 600.0,
    ) -> None:
        if hasattr(seeds, "detach"):
            seeds = seeds.detach().cpu().numpy()
        seeds_a = np.asarray(seeds)
        if seeds_a.dtype == bool:  # a training mask, as PyG datasets ship them
            seeds_a = np.flatnonzero(seeds_a)
        seeds_a = seeds_a.astype(np.int64, copy=False)
        _check_args(graph, seeds_a, fanouts, batch_size, num_workers, pipeline_depth, feature_cache_bytes)
        self.graph, self.num_workers, self.pipeline_depth = graph, int(num_workers), int(pipeline_depth)
        self.timeout_s = float(timeout_s)
        self.seed = random.SystemRandom().randrange(2**31) if seed is None else int(seed)
        self._kwargs = dict(
            fanouts=list(fanouts),
            batch_size=batch_size,
            shuffle=shuffle,
            drop_last=drop_last,
            feature_cache_bytes=feature_cache_bytes,
            cache_dir=cache_dir,
        )
        self.counters = SharedCounters(COUNTERS, cache_dir)
        try:
            self.cache = FeatureCache(graph, int(feature_cache_bytes), cache_dir)
        except BaseException:
            self.counters.close()
            raise
        self.maker = BatchMaker(
            graph,
            seeds_a,
            fanouts,
            int(batch_size),
            bool(shuffle),
            bool(drop_last),
            self.seed,
            self.cache,
            self.counters,
            gather_features,
        )
        self._keys = _EpochKeys(len(self.maker))
        self._next_epoch = 0
        self._closed = False
        self._torch: DataLoader | None = None
        if self.num_workers > 0:
            # (torch's annotations name a Dataset and a batch's collate; its loader takes any map-style object,
            # and with batch_size=None collate_fn gets one item)
            self._torch = DataLoader(
                self.maker,  # type: ignore[arg-type]
                batch_size=None,
                sampler=self._keys,
                num_workers=self.num_workers,
                collate_fn=_identity,  # type: ignore[arg-type]
                persistent_workers=True,
                timeout=self.timeout_s,
                prefetch_factor=max(1, math.ceil(self.pipeline_depth / self.num_workers)),
            )

    def __len__(self) -> int:
        return len(self.maker)

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter(loader)`` run epoch ``epoch`` (by default epochs count 0, 1, ...)."""
        self._next_epoch = int(epoch)

    def __iter__(self) -> Iterator[Batch]:
        if self._closed:
            raise RuntimeError("this NeighborLoader is closed")
        epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        if self._torch is not None:
            return self._iter_workers(epoch, self._torch)
        if self.pipeline_depth == 0:
            return (self.maker[(epoch, b)] for b in range(len(self.maker)))
        return self._iter_thread(epoch)

    def _iter_workers(self, epoch: int, torch_loader: DataLoader) -> Iterator[Batch]:
        self._keys.epoch = epoch
        it = iter(torch_loader)
        while True:
            try:
                batch = next(it)
            except StopIteration:
                return
            except (RuntimeError, ConnectionError, EOFError) as e:
                death = worker_death(e, it)  # also a reset of the data queue by a killed worker
                if death is not None:
                    raise WorkerDiedError(f"a NeighborLoader worker died in epoch {epoch}: {death}") from e
                if isinstance(e, RuntimeError) and "timed out" in str(e):
                    raise CoordlTimeoutError(
                        f"no batch from the NeighborLoader workers in {self.timeout_s:.0f} s"
                    ) from e
                raise
            yield batch

    def _iter_thread(self, epoch: int) -> Iterator[Batch]:
        """One producer thread, at most ``pipeline_depth`` batches made and not yet taken."""
        ready: queue.Queue = queue.Queue()
        room = threading.Semaphore(self.pipeline_depth)
        stop = threading.Event()

        def produce() -> None:
            try:
                for b in range(len(self.maker)):
                    while not room.acquire(timeout=0.1):
                        if stop.is_set():
                            return
                    if stop.is_set():
                        return
                    ready.put(self.maker[(epoch, b)])
                ready.put(None)
            except BaseException as e:  # handed to the caller, raised there
                ready.put(e)

        thread = threading.Thread(target=produce, name="coordl-graph-pipeline", daemon=True)
        thread.start()
        try:
            while True:
                try:
                    item = ready.get(timeout=self.timeout_s)
                except queue.Empty:
                    raise CoordlTimeoutError(
                        f"no batch from the pipeline thread in {self.timeout_s:.0f} s"
                    ) from None
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                room.release()
                yield item
        finally:
            stop.set()
            thread.join(timeout=self.timeout_s)

    def variant(self, **changes: Any) -> NeighborLoader:
        """A new loader with the same graph, seeds and seed, and ``changes`` applied to the other
        arguments (dsanalyzer's differential runs: e.g. ``gather_features=False``)."""
        kwargs: dict[str, Any] = dict(
            self._kwargs,
            num_workers=self.num_workers,
            pipeline_depth=self.pipeline_depth,
            seed=self.seed,
            gather_features=self.maker.gather_features,
            timeout_s=self.timeout_s,
        )
        kwargs.update(changes)
        return NeighborLoader(self.graph, self.maker.seeds, **kwargs)

    def warm_cache(self) -> None:
        """Fill the feature cache now (file order: fast on disks) instead of during the first epoch."""
        self.cache.fill()

    def stats(self) -> dict:
        """Totals over the caller and all workers since construction (or :meth:`reset_stats`)."""
        s: dict[str, Any] = dict(self.counters.snapshot())
        rows = s["cache_hits"] + s["cache_misses"]
        s["cache_hit_ratio"] = s["cache_hits"] / rows if rows else 0.0
        s["sample_s"], s["gather_s"] = s.pop("sample_ns") / 1e9, s.pop("gather_ns") / 1e9
        s["cache_slots"], s["cache_filled"] = self.cache.slots, self.cache.filled
        return s

    def reset_stats(self) -> None:
        self.counters.reset()

    def close(self) -> None:
        """Stop the workers, free the cache and the counters. Idempotent."""
        if self._torch is not None:
            iterator = getattr(self._torch, "_iterator", None)
            if iterator is not None and hasattr(iterator, "_shutdown_workers"):
                iterator._shutdown_workers()
            self._torch._iterator = None
            self._torch = None
        if not self._closed:
            self._closed = True
            self.cache.close()
            self.counters.close()

    def __enter__(self) -> NeighborLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

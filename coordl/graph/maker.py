"""Making one batch: which seeds, sample their neighbourhood, gather the features, wrap as tensors.

A :class:`BatchMaker` is a map-style dataset whose keys are ``(epoch, batch_index)``: everything a
batch depends on is in its key and the loader's seed, so batch ``b`` of epoch ``e`` is the same
whether the caller, a pipeline thread or any of N worker processes makes it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from coordl.graph.batch import Batch
from coordl.graph.cache import FeatureCache
from coordl.graph.graph import Graph
from coordl.graph.sampler import SampledBlocks, batch_rng, sample_blocks
from shmem.counters import SharedCounters

__all__ = ["BatchMaker", "COUNTERS"]

COUNTERS = (
    "batches",
    "seeds",
    "input_nodes",
    "edges",
    "cache_hits",
    "cache_misses",
    "sample_ns",
    "gather_ns",
)


class BatchMaker:
    """``maker[(epoch, b)]`` is batch ``b`` of epoch ``epoch``.

    Args:
        graph: the graph; seeds: training node ids (distinct); fanouts: per hop, -1 for all.
        batch_size, shuffle, drop_last: as in ``torch.utils.data.DataLoader``.
        seed: the seed of the epoch order and of every batch's sampling.
        cache: the hot-feature cache (``slots == 0``: none).
        counters: shared counters the batches are accounted in (summed over workers).
        gather_features: False makes ``x`` zeros of the right shape (dsanalyzer's sampling-only run).
    """

    def __init__(
        self,
        graph: Graph,
        seeds: np.ndarray,
        fanouts: Sequence[int],
        batch_size: int,
        shuffle: bool,
        drop_last: bool,
        seed: int,
        cache: FeatureCache,
        counters: SharedCounters,
        gather_features: bool = True,
    ) -> None:
        self.graph, self.seeds, self.fanouts = graph, seeds, [int(f) for f in fanouts]
        self.batch_size, self.shuffle, self.drop_last, self.seed = batch_size, shuffle, drop_last, seed
        self.cache, self.counters, self.gather_features = cache, counters, gather_features
        self._order_epoch: int | None = None
        self._order: np.ndarray = self.seeds  # drawn again at each new epoch

    def __len__(self) -> int:
        n = self.seeds.size
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def seeds_of(self, epoch: int, batch_index: int) -> np.ndarray:
        """The seeds of batch ``batch_index`` in epoch ``epoch``."""
        if self._order_epoch != epoch:
            if self.shuffle:
                rng = np.random.default_rng([self.seed & 0xFFFFFFFF, 0x5EED, epoch])
                self._order = self.seeds[rng.permutation(self.seeds.size)]
            else:
                self._order = self.seeds
            self._order_epoch = epoch
        lo = batch_index * self.batch_size
        return self._order[lo : lo + self.batch_size]

    def sample(self, epoch: int, batch_index: int) -> tuple[np.ndarray, SampledBlocks]:
        """The sampled blocks of one batch (no features)."""
        rng = batch_rng(self.seed, epoch, batch_index)
        seeds = self.seeds_of(epoch, batch_index)
        return seeds, sample_blocks(self.graph.indptr, self.graph.indices, seeds, self.fanouts, rng)

    def __getitem__(self, key: tuple[int, int]) -> Batch:
        epoch, batch_index = key
        if not 0 <= batch_index < len(self):
            raise IndexError(f"batch {batch_index} out of range: an epoch has {len(self)}")
        t0 = time.perf_counter_ns()
        seeds, blocks = self.sample(epoch, batch_index)
        t1 = time.perf_counter_ns()
        nodes = blocks.input_nodes
        hits = misses = 0
        if self.gather_features:
            x, hits, misses = self.cache.gather(nodes)
        else:
            x = np.zeros((nodes.size, *self.graph.features.shape[1:]), dtype=self.graph.features.dtype)
        labels = self.graph.labels
        y = None if labels is None else torch.from_numpy(np.ascontiguousarray(labels[seeds]))
        t2 = time.perf_counter_ns()
        nodes_t = torch.from_numpy(nodes)
        local = [(torch.from_numpy(s), torch.from_numpy(d)) for s, d in blocks.local_edges]
        edges = [(nodes_t[s], nodes_t[d]) for s, d in local]
        self.counters.add_many(
            {
                "batches": 1,
                "seeds": int(seeds.size),
                "input_nodes": int(nodes.size),
                "edges": sum(int(s.numel()) for s, _ in local),
                "cache_hits": hits,
                "cache_misses": misses,
                "sample_ns": t1 - t0,
                "gather_ns": t2 - t1,
            }
        )
        return Batch(
            seed_nodes=torch.from_numpy(np.array(seeds, dtype=np.int64)),
            input_nodes=nodes_t,
            x=torch.from_numpy(x),
            y=y,
            edges=edges,
            sizes=blocks.sizes,
            local_edges=local,
            batch_index=batch_index,
            epoch=epoch,
        )

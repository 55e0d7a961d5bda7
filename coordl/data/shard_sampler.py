"""``coordl.ShardSampler``: a shuffled order that stays within a few shards at a time.

A uniformly shuffled order over tar shards touches a different shard at every sample: streamed from a bucket,
each read would need its whole shard again (or a ranged GET per sample, as many requests as loose files). This
sampler shuffles the shards, takes them ``window`` at a time, and shuffles the samples of each window, so each
worker holds at most about ``window`` shards (``TarShards(memory_shards=)`` must be at least that) and fetches
each shard about once per epoch. The same trade as Mosaic Streaming's ``py1b`` and WebDataset's shard shuffle
plus buffer: a sample's neighbours come from ``window`` shards, not from the whole dataset; pack shards from a
shuffled list (e.g. ``coordl.data.pack.pack(FileListDataset(shuffled_paths, labels), ...)``: ``coordl pack`` keeps
the source's order) so that a shard mixes classes.

Deterministic: epoch ``e`` of seed ``s`` is always the same order (``set_epoch`` as with DistributedSampler;
without it, each iteration advances the epoch).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

__all__ = ["ShardSampler"]


class ShardSampler:
    """Indices of a sharded dataset (anything with ``shard_ranges()``) in shard-windowed shuffled order.

    Args:
        dataset: e.g. :class:`coordl.TarShards`.
        window: shards whose samples are mixed together (and held in memory at once by a streaming reader).
        shuffle: False keeps shard and sample order (an evaluation pass).
        seed: the order of every epoch follows from it.
    """

    def __init__(self, dataset: object, window: int = 2, *, shuffle: bool = True, seed: int = 0) -> None:
        ranges = getattr(dataset, "shard_ranges", None)
        if not callable(ranges):
            raise TypeError(f"ShardSampler: {type(dataset).__name__} has no shard_ranges() (use TarShards)")
        if window < 1:
            raise ValueError(f"ShardSampler: window must be at least 1, got {window}")
        self.ranges: list[tuple[int, int]] = list(ranges())
        self.window = window
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self._explicit_epoch = False

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._explicit_epoch = True

    def __len__(self) -> int:
        return sum(end - start for start, end in self.ranges)

    def __iter__(self) -> Iterator[int]:
        rng = np.random.default_rng([self.seed, self.epoch])
        if not self._explicit_epoch:
            self.epoch += 1
        order = rng.permutation(len(self.ranges)) if self.shuffle else np.arange(len(self.ranges))
        for w in range(0, len(order), self.window):
            idx = np.concatenate([np.arange(*self.ranges[s]) for s in order[w : w + self.window]])
            if self.shuffle:
                rng.shuffle(idx)
            yield from idx.tolist()

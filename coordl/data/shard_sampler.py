"""``coordl.ShardSampler``: a shuffled order that stays within a few shards at a time.

A uniformly shuffled order over tar shards touches a different shard at every sample: streamed from a bucket,
each read would need its whole shard again (or a ranged GET per sample, as many requests as loose files). This
sampler shuffles the shards, takes them ``window`` at a time, and shuffles the samples of each window, so each
worker holds at most about ``window`` shards (``TarShards(memory_shards=)`` must be at least that) and fetches
each shard about once per epoch. The same trade as Mosaic Streaming's ``py1b`` and WebDataset's shard shuffle
plus buffer: a sample's neighbours come from ``window`` shards, not from the whole dataset; pack shards from a
shuffled list (e.g. ``coordl.data.pack.pack(FileListDataset(shuffled_paths, labels), ...)``: ``coordl pack`` keeps
the source's order) so that a shard mixes classes.

With DataLoader workers, each worker would otherwise read every shard of a window (torch hands batch ``b`` to
worker ``b % num_workers``), so a streamed shard would be fetched once per worker. Given ``batch_size`` and
``num_workers``, the sampler deals the shards out to the workers and orders batches so that batch ``b`` draws
only from worker ``b % num_workers``'s shards: each shard is fetched by one worker, once per epoch (workers whose
shards run out first hand their last turns to the others, so the epoch's tail may cross).

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
        batch_size, num_workers: the loader's; with ``num_workers > 1`` each shard goes to one worker.
    """

    def __init__(
        self,
        dataset: object,
        window: int = 2,
        *,
        shuffle: bool = True,
        seed: int = 0,
        batch_size: int = 1,
        num_workers: int = 0,
    ) -> None:
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
        if batch_size < 1 or num_workers < 0:
            raise ValueError(f"ShardSampler: batch_size must be >= 1 and num_workers >= 0, got {batch_size}, "
                             f"{num_workers}")  # fmt: skip
        self.batch_size = batch_size
        self.num_workers = num_workers

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._explicit_epoch = True

    def __len__(self) -> int:
        return sum(end - start for start, end in self.ranges)

    def _stream(self, shards: np.ndarray, rng: np.random.Generator) -> list[int]:
        out: list[int] = []
        for w in range(0, len(shards), self.window):
            idx = np.concatenate([np.arange(*self.ranges[s]) for s in shards[w : w + self.window]])
            if self.shuffle:
                rng.shuffle(idx)
            out.extend(idx.tolist())
        return out

    def __iter__(self) -> Iterator[int]:
        rng = np.random.default_rng([self.seed, self.epoch])
        if not self._explicit_epoch:
            self.epoch += 1
        order = rng.permutation(len(self.ranges)) if self.shuffle else np.arange(len(self.ranges))
        if self.num_workers <= 1:
            yield from self._stream(order, rng)
            return
        dealt: list[list[int]] = [[] for _ in range(self.num_workers)]
        load = [0] * self.num_workers
        for sh in order.tolist():  # each shard to the worker with the fewest samples so far: balanced streams
            k = load.index(min(load))
            dealt[k].append(sh)
            load[k] += self.ranges[sh][1] - self.ranges[sh][0]
        streams = [self._stream(np.array(d, dtype=np.int64), rng) for d in dealt]
        pos = [0] * self.num_workers
        b = self.batch_size
        while any(p < len(st) for p, st in zip(pos, streams, strict=True)):
            for k in range(self.num_workers):  # batch j of the loader goes to worker j % num_workers
                # this worker's next batch; topped up (its shards done) from whichever has most left, so every
                # batch but the last has batch_size items and batches stay aligned with the workers
                need, src = b, k
                while need and any(p < len(st) for p, st in zip(pos, streams, strict=True)):
                    if pos[src] >= len(streams[src]):
                        src = max(range(self.num_workers), key=lambda j: len(streams[j]) - pos[j])
                    take = streams[src][pos[src] : pos[src] + need]
                    pos[src] += len(take)
                    need -= len(take)
                    yield from take

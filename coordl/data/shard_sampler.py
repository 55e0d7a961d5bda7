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
without it, each iteration advances the epoch). Because the order follows from a few numbers, a reader that
streams whole shards (``TarShards`` from a bucket) can fetch each worker's next shards before it needs them:
the sampler hands the dataset a :class:`ShardPlan` (its settings, plus the epoch it is in, shared with the
loader's worker processes through a tiny shared-memory segment), and each worker recomputes which shards
follow the one it is reading in its own stream.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from shmem.segment import Segment

__all__ = ["ShardSampler", "ShardPlan"]


def shard_order(n_shards: int, seed: int, epoch: int, shuffle: bool) -> tuple[np.ndarray, np.random.Generator]:
    """The shards' order in epoch ``epoch`` and the generator that then shuffles the samples (one definition)."""
    rng = np.random.default_rng([seed, epoch])
    return (rng.permutation(n_shards) if shuffle else np.arange(n_shards)), rng


def deal(order: list[int], ranges: list[tuple[int, int]], num_workers: int) -> list[list[int]]:
    """Each shard, in ``order``, to the stream with the fewest samples so far: one stream per worker."""
    if num_workers <= 1:
        return [list(order)]
    dealt: list[list[int]] = [[] for _ in range(num_workers)]
    load = [0] * num_workers
    for sh in order:
        k = load.index(min(load))
        dealt[k].append(sh)
        load[k] += ranges[sh][1] - ranges[sh][0]
    return dealt


class ShardPlan:
    """Which shards follow a shard in its reader's stream, in the epoch the sampler is iterating.

    Made by :class:`ShardSampler` for a dataset that streams whole shards (``dataset.wants_shard_plan()``) and
    given to it with ``dataset.attach_shard_plan(plan)`` before any worker starts, so every worker's copy
    holds the sampler's settings. The sampler's main-process iteration writes the epoch into an 8-byte
    shared-memory segment (``coordl-shardplan-*`` in /dev/shm, unlinked when the plan is collected or at
    exit); a worker reads it and recomputes the dealing (one permutation, no samples), cached per epoch.
    A wrong guess (a worker still finishing the last epoch) costs a prefetched shard, never a wrong sample.
    """

    def __init__(self, ranges: list[tuple[int, int]], window: int, shuffle: bool, seed: int,
                 num_workers: int) -> None:  # fmt: skip
        self.ranges, self.window, self.shuffle, self.seed = ranges, window, shuffle, seed
        self.num_workers = num_workers
        self._segment = Segment.create("shardplan", 8)
        self._attach()
        self._epoch_view[0] = -1

    def _attach(self) -> None:
        self._epoch_view = self._segment.array(np.int64, 0, 1)
        self._cached_epoch = -2
        self._where: dict[int, tuple[int, int]] = {}
        self._streams: list[list[int]] = []

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for name in ("_epoch_view", "_cached_epoch", "_where", "_streams"):
            state.pop(name)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._attach()

    def publish(self, epoch: int) -> None:
        """Called by the sampler as an epoch's iteration starts (before the loader hands out its indices)."""
        self._epoch_view[0] = epoch

    @property
    def epoch(self) -> int:
        """The epoch last published (-1: none yet)."""
        return int(self._epoch_view[0])

    def locate(self, shard: int) -> tuple[int, int, int] | None:
        """(epoch, stream, position) of ``shard`` in the current epoch's streams; None before any epoch."""
        epoch = self.epoch
        if epoch < 0:
            return None
        if epoch != self._cached_epoch:
            order, _ = shard_order(len(self.ranges), self.seed, epoch, self.shuffle)
            self._streams = deal(order.tolist(), self.ranges, self.num_workers)
            self._where = {sh: (k, j) for k, st in enumerate(self._streams) for j, sh in enumerate(st)}
            self._cached_epoch = epoch
        found = self._where.get(shard)
        return None if found is None else (epoch, *found)

    def following(self, stream: int, position: int) -> list[int]:
        """The shards after ``position`` in ``stream`` (as of the last :meth:`locate`)."""
        return self._streams[stream][position + 1 :]


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
        self.plan: ShardPlan | None = None
        wants = getattr(dataset, "wants_shard_plan", None)
        if callable(wants) and wants():  # it streams whole shards: let its workers fetch the next ones early
            self.plan = ShardPlan(self.ranges, window, shuffle, seed, num_workers)
            dataset.attach_shard_plan(self.plan)

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
        order, rng = shard_order(len(self.ranges), self.seed, self.epoch, self.shuffle)
        if self.plan is not None:
            self.plan.publish(self.epoch)
        if not self._explicit_epoch:
            self.epoch += 1
        if self.num_workers <= 1:
            yield from self._stream(order, rng)
            return
        dealt = deal(order.tolist(), self.ranges, self.num_workers)  # balanced by samples
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

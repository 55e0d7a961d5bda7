"""``coordl.ShardSampler``: a shuffled order that stays within a few shards at a time.

A uniformly shuffled order over tar shards touches a different shard at every sample: streamed from a bucket,
each read would need its whole shard again (or a ranged GET per sample, as many requests as loose files). This
sampler shuffles the shards, takes them ``window`` at a time, and shuffles the samples of each window, so each
worker holds at most about ``window`` shards (``TarShards(memory_shards=)`` must be at least that) and fetches
each shard about once per epoch. The same trade as Mosaic Streaming's ``py1b`` and WebDataset's shard shuffle
plus buffer: a sample's neighbours come from ``window`` shards, not from the whole dataset; pack shards from a
shuffled list (e.g. ``coordl.packing.pack.pack(FileListDataset(shuffled_paths, labels), ...)``: ``coordl pack`` keeps
the source's order) so that a shard mixes classes.

With DataLoader workers, each worker would otherwise read every shard of a window (torch hands batch ``b`` to
worker ``b % num_workers``), so a streamed shard would be fetched once per worker. Given ``batch_size`` and
``num_workers``, the sampler deals the shards out to the workers and orders batches so that batch ``b`` draws
only from worker ``b % num_workers``'s shards: each shard is fetched by one worker, once per epoch (workers whose
shards run out first hand their last turns to the others, so the epoch's tail may cross).

Deterministic: epoch ``e`` of seed ``s`` is always the same order (``set_epoch`` as with DistributedSampler;
without it, each iteration advances the epoch), given which shards are staged locally: for a dataset with
``local_shards()``, staged shards take the last places of each worker's stream (see :func:`locals_last`).
Because the sampler knows each worker's order, a reader that streams whole shards (``TarShards`` from a
bucket) can fetch each worker's next shards before it needs them: the sampler hands the dataset a :class:`ShardPlan` (each epoch's streams, shared with the loader's worker
processes through a small shared-memory segment), and each worker looks up which shards follow the one it is
reading in its own stream.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from shmem.segment import Segment

__all__ = ["ShardSampler", "ShardPlan", "deal", "locals_last", "shard_order"]


def shard_order(
    n_shards: int, seed: int, epoch: int, shuffle: bool
) -> tuple[np.ndarray, np.random.Generator]:
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
    given to it with ``dataset.attach_shard_plan(plan)`` before any worker starts. As each epoch's iteration
    starts in the main process, the sampler writes that epoch's streams (one per worker: its shards in order)
    into a small shared-memory segment (``coordl-shardplan-*`` in /dev/shm, 8 bytes per shard; unlinked when
    the plan is collected or at exit); a worker reads it when it reaches a shard. A publish count, odd while a
    plan is written, is read before and after the plan (a torn read is ignored, even of an epoch published
    twice, as ``set_epoch`` with other local shards does), so a worker never follows half of two plans. A stale
    plan (a worker still finishing the last epoch) costs a shard fetched early, never a wrong sample.
    """

    def __init__(self, n_shards: int, num_workers: int, window: int = 1) -> None:
        self.n_shards, self.n_streams, self.window = n_shards, max(1, num_workers), window
        self._segment = Segment.create("shardplan", 8 * (1 + self.n_streams + 1 + n_shards + 1))
        self._attach()
        self._table[0] = -1

    def _attach(self) -> None:
        words = 1 + self.n_streams + 1 + self.n_shards
        self._table = self._segment.array(np.int64, 0, words)
        self._count = self._segment.array(
            np.int64, 8 * words, 1
        )  # publishes begun + ended: odd while writing
        self._cached, self._cached_epoch = -1, -1
        self._where: dict[int, tuple[int, int]] = {}
        self._streams: list[list[int]] = []

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for name in ("_table", "_count", "_cached", "_cached_epoch", "_where", "_streams"):
            state.pop(name)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._attach()

    def publish(self, epoch: int, streams: list[list[int]]) -> None:
        """Called by the sampler as an epoch's iteration starts (before the loader hands out its indices)."""
        t = self._table
        self._count[0] += 1  # odd: readers ignore the plan while it is rewritten
        t[0] = -1
        bounds = np.cumsum([0] + [len(st) for st in streams])
        t[1 : 1 + len(bounds)] = bounds
        flat = [sh for st in streams for sh in st]
        t[2 + self.n_streams : 2 + self.n_streams + len(flat)] = flat
        t[0] = epoch
        self._count[0] += 1

    @property
    def epoch(self) -> int:
        """The epoch last published (-1: none yet, or being rewritten)."""
        return int(self._table[0])

    def _load(self, count: int) -> bool:
        t = self._table
        bounds = t[1 : 2 + self.n_streams].tolist()
        flat = t[2 + self.n_streams : 2 + self.n_streams + min(max(bounds[-1], 0), self.n_shards)].tolist()
        epoch = int(t[0])
        if int(self._count[0]) != count:
            return False  # rewritten meanwhile
        self._streams = [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        self._where = {sh: (k, j) for k, st in enumerate(self._streams) for j, sh in enumerate(st)}
        self._cached, self._cached_epoch = count, epoch
        return True

    def locate(self, shard: int) -> tuple[int, int, int] | None:
        """(epoch, stream, position) of ``shard`` in the current epoch's streams; None before any epoch."""
        count = int(self._count[0])
        if count == 0 or count % 2 or (count != self._cached and not self._load(count)):
            return None  # nothing published yet, or a plan being written
        found = self._where.get(shard)
        return None if found is None else (self._cached_epoch, *found)

    def ahead_of(self, stream: int, position: int) -> list[int]:
        """The shards of ``stream`` from the start of ``position``'s window on (as of the last :meth:`locate`):
        the window's shards are read interleaved, so all of them are still wanted."""
        return self._streams[stream][position - position % self.window :]


def locals_last(stream: list[int], local: set[int], tail: int) -> list[int]:
    """``stream`` with local shards swapped into its last ``tail`` places (as many as it has), else unchanged.

    Why: when one worker's shards run out first, it reads the last samples of another worker's stream, so the
    shards there are read by two workers; streamed from a bucket, each would GET them (8 MB of 90 per epoch
    measured with 22 shards). Staged (local) shards there cost no request. The rest keeps its order, so local
    and remote shards stay mixed and the link keeps working through the epoch.
    """
    out = list(stream)
    spare = [j for j in range(max(0, len(out) - tail)) if out[j] in local]
    for i in range(len(out) - 1, max(-1, len(out) - tail - 1), -1):
        if out[i] not in local and spare:
            j = spare.pop()
            out[i], out[j] = out[j], out[i]
    return out


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
            attach = getattr(dataset, "attach_shard_plan", None)
            if not callable(attach):
                raise TypeError(
                    f"ShardSampler: {type(dataset).__name__} wants a shard plan, has no attach_shard_plan()"
                )
            self.plan = ShardPlan(len(self.ranges), num_workers, window)
            attach(self.plan)
        local = getattr(dataset, "local_shards", None)
        self._local_shards = local if callable(local) else None

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
        dealt = deal(order.tolist(), self.ranges, self.num_workers)  # balanced by samples
        if len(dealt) > 1 and self.shuffle and self._local_shards is not None:
            local = set(self._local_shards())
            dealt = [locals_last(d, local, self.window) for d in dealt]
        if self.plan is not None:
            self.plan.publish(self.epoch, dealt)
        if not self._explicit_epoch:
            self.epoch += 1
        if self.num_workers <= 1:
            yield from self._stream(np.array(dealt[0], dtype=np.int64), rng)
            return
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

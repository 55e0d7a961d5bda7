"""coordl.ShardSampler: a permutation per epoch, within shard windows, batches aligned with the workers."""

from __future__ import annotations

import pytest

import coordl


class _Shards:
    def __init__(self, sizes):
        starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        self.ranges = list(zip(starts[:-1], starts[1:], strict=True))

    def shard_ranges(self):
        return self.ranges

    def shard_of(self, i):
        return next(k for k, (a, b) in enumerate(self.ranges) if a <= i < b)


SIZES = [7, 23, 3, 17, 1, 9, 12, 12]


def test_every_epoch_is_a_permutation_and_differs():
    ds = _Shards(SIZES)
    s = coordl.ShardSampler(ds, window=2, seed=5)
    first, second = list(s), list(s)
    assert sorted(first) == sorted(second) == list(range(sum(SIZES))) and first != second
    s.set_epoch(0)
    assert list(s) == first  # deterministic: epoch 0 of seed 5 again


def test_reads_stay_within_a_window_of_shards():
    ds = _Shards(SIZES)
    shards = [ds.shard_of(i) for i in coordl.ShardSampler(ds, window=2, seed=1)]
    first, last = {}, {}
    for pos, sh in enumerate(shards):
        first.setdefault(sh, pos)
        last[sh] = pos
    for pos in range(len(shards)):  # shards begun and not finished at each point: at most the window
        assert sum(first[sh] <= pos <= last[sh] for sh in first) <= 2


@pytest.mark.parametrize("workers", [2, 3])
def test_batches_of_a_worker_come_from_its_own_shards(workers):
    ds, b = _Shards(SIZES), 4
    order = list(coordl.ShardSampler(ds, window=1, seed=2, batch_size=b, num_workers=workers))
    assert sorted(order) == list(range(sum(SIZES)))
    batches = [order[i : i + b] for i in range(0, len(order), b)]
    owner: dict[int, set[int]] = {}
    for j, batch in enumerate(batches):
        for i in batch:
            owner.setdefault(ds.shard_of(i), set()).add(j % workers)
    shared = [sh for sh, ws in owner.items() if len(ws) > 1]
    assert len(shared) <= workers  # only where a worker's shards ran out near the end


def test_needs_shard_ranges():
    with pytest.raises(TypeError, match="shard_ranges"):
        coordl.ShardSampler([1, 2, 3])

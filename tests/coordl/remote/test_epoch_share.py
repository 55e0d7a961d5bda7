"""The merged epoch's rule for torch's draws (coordl/remote/epoch.py's ``_local_may_draw``): torch's workers
take another batch only while their queue would end no later than the actors' queues with every batch
left, so that at the epoch's end neither side drains a long queue while the other idles. Unit tests on the
rule alone (the whole epoch runs on a real cluster in test_remote_prep.py)."""

from __future__ import annotations

import collections
from types import SimpleNamespace

from coordl.remote.epoch import LOCAL, MergedEpoch


def _epoch(queued: int, pending: list[int], left: int, handed=(0, 0), workers: int = 1) -> MergedEpoch:
    epoch = MergedEpoch.__new__(MergedEpoch)  # the rule reads only these
    actors = [SimpleNamespace(pending=p, alive=True) for p in pending]
    epoch.side = SimpleNamespace(live=lambda: actors, handed=list(handed))
    epoch.assigned = collections.deque([LOCAL] * queued)
    epoch.torch_iter = [None] * (100 + left)
    epoch.drawn = 100
    epoch.workers = workers
    return epoch


def test_early_in_the_epoch_torch_takes_what_it_asks_for():
    assert _epoch(queued=5, pending=[2], left=60)._local_may_draw()


def test_at_the_end_the_batches_left_go_to_the_faster_side():
    # one batch left, the actor twice as fast (by the batches each side handed out so far)
    assert not _epoch(queued=2, pending=[2], left=1, handed=(100, 200))._local_may_draw()
    # the workers twice as fast: they take it
    assert _epoch(queued=1, pending=[2], left=1, handed=(200, 100))._local_may_draw()


def test_torch_always_keeps_a_batch_and_takes_all_without_actors():
    assert _epoch(queued=0, pending=[2], left=1, handed=(1, 1000))._local_may_draw()
    assert _epoch(queued=9, pending=[], left=1)._local_may_draw()


def test_a_sampler_without_len_is_a_long_epoch():
    epoch = _epoch(queued=3, pending=[2], left=0, handed=(1, 1000))
    epoch.torch_iter = iter(())  # no len()
    assert epoch._local_may_draw()

"""The merged epoch's rule for torch's draws (coordl/remote/epoch.py's ``torch_may_draw``): torch's workers
take another batch only while their queue would end no later than the actors' queues with every batch
left, so that at the epoch's end neither side drains a long queue while the other idles. Unit tests on the
rule alone (the whole epoch runs on a real cluster in test_remote_prep.py)."""

from __future__ import annotations

from coordl.remote.epoch import torch_may_draw


def test_early_in_the_epoch_torch_takes_what_it_asks_for():
    assert torch_may_draw(queued=5, pending=[2], left=60, handed=[0, 0], workers=1)


def test_at_the_end_the_batches_left_go_to_the_faster_side():
    # one batch left, the actor twice as fast (by the batches each side handed out so far)
    assert not torch_may_draw(queued=2, pending=[2], left=1, handed=[100, 200], workers=1)
    # the workers twice as fast: they take it
    assert torch_may_draw(queued=1, pending=[2], left=1, handed=[200, 100], workers=1)
    # more batches left for the actors: the workers take one too
    assert torch_may_draw(queued=2, pending=[2], left=5, handed=[100, 200], workers=1)


def test_torch_always_keeps_a_batch_and_takes_all_without_actors_or_a_known_end():
    assert torch_may_draw(queued=0, pending=[2], left=1, handed=[1, 1000], workers=1)
    assert torch_may_draw(queued=9, pending=[], left=1, handed=[0, 0], workers=1)
    assert torch_may_draw(queued=9, pending=[2], left=None, handed=[1, 1000], workers=1)

"""EpochPlan: the batch plan DALI's workers read while the loader publishes the next epoch's.

A stale prefetch of an ended epoch may still run while ``write()`` publishes the next one (a user who
breaks out of an epoch early, a loaded machine). It must get None (DALI discards it), never a batch
made of two epochs' indices and never an error that DALI reports at the start of the next epoch.
No DALI needed: the plan is plain shared memory.
"""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest

from coordl.dali.feed import EpochPlan
from coordl.errors import CoordlError

NB, BS = 500, 8


def _batches(epoch: int) -> list[list[int]]:
    return [[epoch * 1_000_000 + b * BS + k for k in range(BS)] for b in range(NB)]


def _publish(plan: EpochPlan, stop) -> None:
    epoch = 1
    while not stop.value:
        plan.write(epoch, _batches(epoch))
        epoch += 1


def test_a_reader_racing_the_next_epochs_plan_gets_whole_batches_or_none():
    plan = EpochPlan(NB, NB * BS)
    plan.write(0, _batches(0))
    stop = mp.get_context("fork").RawValue("b", 0)
    writer = mp.get_context("fork").Process(target=_publish, args=(plan, stop), daemon=True)
    writer.start()
    it = NB - 1  # the last batch: written last, the widest window
    try:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:  # every answer whole or None, however the two interleave
            epoch = int(plan.header[0])
            got = plan.batch(epoch, it) if epoch >= 0 else None
            assert got is None or got == [epoch * 1_000_000 + it * BS + k for k in range(BS)]
        stop.value = 1
        writer.join(10)
        epoch = int(plan.header[0])  # the writer is done: the last plan is whole
        assert plan.batch(epoch, it) == [epoch * 1_000_000 + it * BS + k for k in range(BS)]
    finally:
        stop.value = 1
        writer.join(10)
        plan.close()


def test_a_plan_being_written_is_stale_for_older_epochs_and_an_error_for_newer_ones():
    plan = EpochPlan(4, 16)
    try:
        plan.write(3, [[1, 2], [3, 4]])
        assert plan.batch(3, 1) == [3, 4] and plan.batch(3, 2) is None and plan.batch(2, 0) is None
        plan.header[3], plan.header[0] = 4, -1  # write(4) caught half way
        assert plan.batch(3, 0) is None
        with pytest.raises(CoordlError, match="epoch 5 but the plan holds epoch -1"):
            plan.batch(5, 0)
    finally:
        plan.close()

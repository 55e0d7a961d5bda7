"""Coordinated prep: jobs share one batch sequence, each batch is prepped once, failures never hang."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest
import torch

from coordl import group_control as gc
from coordl.coordinate import Group, GroupMember
from coordl.counters import SharedCounters
from coordl.errors import CoordlTimeoutError

N_ITEMS, BS = 40, 4


class _MakeBatch:
    """Prep that counts its calls across processes and can be slowed down."""

    def __init__(self, counters: SharedCounters, delay_s: float = 0.0) -> None:
        self.counters, self.delay_s = counters, delay_s

    def __call__(self, indices: list[int]):
        self.counters.add("batches")
        time.sleep(self.delay_s)
        x = torch.tensor(indices, dtype=torch.float32)
        return x.reshape(-1, 1).repeat(1, 3), torch.tensor(indices)


def _job(
    name,
    tmp,
    counters,
    epochs,
    out,
    tag=0,
    delay_s=0.0,
    consume_delay_s=0.0,
    join_delay_s=0.0,
    break_after=None,
):
    time.sleep(join_delay_s)
    m = GroupMember(Group(name, slots=4, timeout_s=30, seed=1, directory=tmp), num_items=N_ITEMS,
                    batch_size=BS, drop_last=False, shuffle=True, make_batch=_MakeBatch(counters, delay_s))  # fmt: skip
    seen = []
    for _ in range(epochs):
        for i, (x, y) in enumerate(m.epoch()):
            assert torch.equal(x[:, 0].long(), y)
            seen.append(y.tolist())
            time.sleep(consume_delay_s)
            if break_after is not None and i + 1 == break_after:
                break
    m.close()
    out.put((tag, seen))


def _run_jobs(tmp, specs, timeout=60):
    counters = SharedCounters(["batches"], directory=tmp)
    q = mp.get_context("fork").Queue()
    procs = [mp.get_context("fork").Process(target=_job, args=("g", str(tmp), counters), kwargs={"out": q, "tag": i, **s})
             for i, s in enumerate(specs)]  # fmt: skip
    for p in procs:
        p.start()
    results = [q.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join(10)
        assert p.exitcode == 0
    return [seen for _, seen in sorted(results)], counters.snapshot()["batches"]


def test_every_job_sees_every_batch_and_each_batch_is_prepped_once(tmp_path):
    seen, prepped = _run_jobs(tmp_path, [{"epochs": 2}, {"epochs": 2}, {"epochs": 2}])
    assert seen[0] == seen[1] == seen[2]
    per_epoch = N_ITEMS // BS
    assert len(seen[0]) == 2 * per_epoch
    for e in range(2):
        flat = sorted(i for b in seen[0][e * per_epoch : (e + 1) * per_epoch] for i in b)
        assert flat == list(range(N_ITEMS))
    assert seen[0][:per_epoch] != seen[0][per_epoch:]  # a fresh permutation each epoch
    # Plus at most one ring (4 slots) of look-ahead nobody consumed, and the probe batch that sizes
    # the slots when the group is created.
    assert 2 * per_epoch <= prepped <= 2 * per_epoch + 4 + 1
    assert not [f for f in os.listdir(tmp_path) if f.startswith("coordl-grp-")]  # lock file included


def test_slow_consumer_bounds_memory_and_fast_job_waits(tmp_path):
    seen, _ = _run_jobs(tmp_path, [{"epochs": 1}, {"epochs": 1, "consume_delay_s": 0.05}])
    assert seen[0] == seen[1]


def test_early_break_releases_the_group(tmp_path):
    seen, _ = _run_jobs(tmp_path, [{"epochs": 2}, {"epochs": 2, "break_after": 2}])
    assert len(seen[1]) == 4 and len(seen[0]) == 20
    assert seen[1][:2] == seen[0][:2] and seen[1][2:] == seen[0][10:12]


def test_late_joiner_starts_at_an_epoch_boundary(tmp_path):
    # The first job spends ~0.5 s per epoch, so the joiner arrives during its epoch 0 or 1.
    seen, _ = _run_jobs(
        tmp_path, [{"epochs": 5, "consume_delay_s": 0.05}, {"epochs": 1, "join_delay_s": 0.6}]
    )
    per_epoch = N_ITEMS // BS
    epochs = [seen[0][e * per_epoch : (e + 1) * per_epoch] for e in range(5)]
    assert seen[1] in epochs[1:4]


def _victim(tmp, counters, ready):
    m = GroupMember(Group("g", slots=4, timeout_s=30, seed=1, directory=tmp), num_items=N_ITEMS, batch_size=BS,
                    drop_last=False, shuffle=True, make_batch=_MakeBatch(counters, 0.05))  # fmt: skip
    it = m.epoch()
    next(it)
    ready.set()
    time.sleep(60)


def test_killed_job_does_not_hang_the_others(tmp_path):
    counters = SharedCounters(["batches"], directory=tmp_path)
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    victim = ctx.Process(target=_victim, args=(str(tmp_path), counters, ready))
    victim.start()
    assert ready.wait(30)
    q = ctx.Queue()
    survivor = ctx.Process(target=_job, args=("g", str(tmp_path), counters), kwargs={"out": q, "epochs": 2})
    survivor.start()
    time.sleep(0.3)
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(10)
    _, seen = q.get(timeout=60)
    survivor.join(10)
    assert survivor.exitcode == 0
    assert len(seen) == 2 * (N_ITEMS // BS)


def test_mismatched_parameters_are_named(tmp_path):
    counters = SharedCounters(["batches"], directory=tmp_path)
    a = GroupMember(Group("g", directory=str(tmp_path)), num_items=N_ITEMS, batch_size=BS, drop_last=False,
                    shuffle=False, make_batch=_MakeBatch(counters))  # fmt: skip
    with pytest.raises(ValueError, match="batch_size=8"):
        GroupMember(Group("g", directory=str(tmp_path)), num_items=N_ITEMS, batch_size=8, drop_last=False,
                    shuffle=False, make_batch=_MakeBatch(counters))  # fmt: skip
    a.close()


def test_wait_times_out_with_a_clear_error(tmp_path):
    counters = SharedCounters(["batches"], directory=tmp_path)
    slot_bytes = 64 << 10  # given, so creating the group needs no probe batch
    m = GroupMember(Group("g", timeout_s=1, slot_bytes=slot_bytes, directory=str(tmp_path)), num_items=N_ITEMS,
                    batch_size=BS, drop_last=False, shuffle=False, make_batch=_MakeBatch(counters, delay_s=30))  # fmt: skip
    with pytest.raises(CoordlTimeoutError, match="batch 0 of group epoch 0"):
        next(m.epoch())
    m.close()


def _join_and_report_first(tmp, counters, out):
    m = GroupMember(Group("g", slots=8, seed=1, directory=tmp), num_items=16, batch_size=BS, drop_last=False,
                    shuffle=True, make_batch=_MakeBatch(counters))  # fmt: skip
    out.put(int(m._ctl.members[m._row, 2]))
    m.close()


def test_joiner_shares_the_current_epoch_while_it_is_still_in_the_ring(tmp_path):
    # 4 batches per epoch, 8 slots: the first job's producer runs into epoch 1 before anyone reads.
    counters = SharedCounters(["batches"], directory=tmp_path)
    first = GroupMember(Group("g", slots=8, seed=1, directory=str(tmp_path)), num_items=16, batch_size=BS,
                        drop_last=False, shuffle=True, make_batch=_MakeBatch(counters))  # fmt: skip
    deadline = time.monotonic() + 30
    while int(first._ctl.hdr[gc.H_NEXT]) < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert int(first._ctl.hdr[gc.H_NEXT]) >= 6
    q = mp.get_context("fork").Queue()
    p = mp.get_context("fork").Process(target=_join_and_report_first, args=(str(tmp_path), counters, q))
    p.start()
    assert q.get(timeout=30) == 0
    p.join(10)
    first.close()

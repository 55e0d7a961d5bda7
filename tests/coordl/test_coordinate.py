"""Coordinated prep: jobs share one batch sequence, each batch is prepped once, failures never hang."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import pytest
import torch

from coordl.coordinated import control as gc
from coordl.coordinated.job import Group, GroupMember
from coordl.errors import CoordlTimeoutError
from shmem.counters import SharedCounters

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
    break_after=None,
    wait_for=None,
    joined=None,
    pause_at=None,
    barrier=None,
):
    """One job. ``wait_for``: an event to wait for before joining; ``joined``: set once a member;
    ``barrier``: met once a member, so that every job is a member before any reads (else a job that
    starts late joins at the next epoch boundary, by design);
    ``pause_at`` (batch count, event, event): after that many batches, set the first event and wait
    for the second before reading on."""
    if wait_for is not None:
        assert wait_for.wait(60)
    m = GroupMember(Group(name, slots=4, timeout_s=30, seed=1, directory=tmp), num_items=N_ITEMS,
                    batch_size=BS, drop_last=False, shuffle=True, make_batch=_MakeBatch(counters, delay_s))  # fmt: skip
    if joined is not None:
        joined.set()
    if barrier is not None:
        barrier.wait(60)
    seen = []
    for _ in range(epochs):
        for i, (x, y) in enumerate(m.epoch()):
            assert torch.equal(x[:, 0].long(), y)
            seen.append(y.tolist())
            time.sleep(consume_delay_s)
            if pause_at is not None and len(seen) == pause_at[0]:
                pause_at[1].set()  # tell the test this job is mid-epoch here
                assert pause_at[2].wait(60)  # and hold until the other job is a member
            if break_after is not None and i + 1 == break_after:
                break
    m.close()
    out.put((tag, seen))


def _run_jobs(tmp, specs, timeout=60, together=True):
    """Run one process per spec; ``together``: all are members before any reads (a barrier)."""
    counters = SharedCounters(["batches"], directory=tmp)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    sync = {"barrier": ctx.Barrier(len(specs))} if together else {}
    procs = [ctx.Process(target=_job, args=("g", str(tmp), counters), kwargs={"out": q, "tag": i, **sync, **s})
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
    # Events, not sleeps: the joiner joins while the first job holds batch 3 of its epoch 1, so it
    # arrives mid-epoch whatever the machine's speed.
    ctx = mp.get_context("fork")
    mid_epoch, joined = ctx.Event(), ctx.Event()
    per_epoch = N_ITEMS // BS
    seen, _ = _run_jobs(
        tmp_path,
        [
            {"epochs": 4, "pause_at": (per_epoch + 3, mid_epoch, joined)},
            {"epochs": 1, "wait_for": mid_epoch, "joined": joined},
        ],
        together=False,
    )
    epochs = [seen[0][e * per_epoch : (e + 1) * per_epoch] for e in range(4)]
    # A whole epoch of the first job: epoch 1 if its batch 0 is still in the ring, else epoch 2.
    assert seen[1] in epochs[1:3]


def test_a_half_written_claim_is_never_read_as_the_new_batch(tmp_path):
    # CI once saw a job read batch 24 as a second copy of batch 20 (same slot of 4): the reader saw
    # the producer's new batch number beside the slot's old READY state. A reader now looks under the
    # lock that every slot write holds, so a claim caught half written is waited out, never read.
    base = str(tmp_path / "coordl-grp-0123456789abcdef")
    open(base + ".lock", "w").close()
    with open(base + ".ctl", "wb") as f:
        f.truncate(gc.ctl_size(4))
    producer, reader = gc.Control(base, 4), gc.Control(base, 4)
    producer.slots[0] = (20, gc.READY, 0, 0, 100)
    assert reader.ready_bytes(0, 20) == 100
    got = []
    with producer.locked():
        producer.slots[0, 0] = 24  # the claim of batch 24, caught half way: old state, new number
        t = threading.Thread(target=lambda: got.append(reader.ready_bytes(0, 24)))
        t.start()
        t.join(0.3)
        assert t.is_alive() and not got  # waits for the claim to be whole
        producer.slots[0, 1] = gc.CLAIMED
    t.join(10)
    assert got == [None]
    with producer.locked():
        producer.slots[0, 4], producer.slots[0, 1] = 7, gc.READY
    assert reader.ready_bytes(0, 24) == 7 and reader.ready_bytes(0, 20) is None
    # claim() writes the state before the number, so even an unlocked look never pairs them wrongly.
    with producer.locked():
        producer.claim(0, 28, os.getpid(), 1)
    assert list(reader.slots[0, :4]) == [28, gc.CLAIMED, os.getpid(), 1]
    assert reader.ready_bytes(0, 28) is None
    producer.close()
    reader.close()


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
    q, joined = ctx.Queue(), ctx.Event()
    survivor = ctx.Process(target=_job, args=("g", str(tmp_path), counters),
                           kwargs={"out": q, "epochs": 2, "joined": joined})  # fmt: skip
    survivor.start()
    assert joined.wait(60)  # both are members when the victim dies
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

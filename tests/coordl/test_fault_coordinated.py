"""Faults of a coordinated group, through ``coordl.DataLoader(coordinate=...)`` in real job processes.

Promises: a job killed with SIGKILL mid-epoch does not stop the others (they finish every epoch, each
item once per epoch, within a bound); a late job joins at an epoch boundary and gets whole group
epochs; a slow job makes the fast one wait but both get the same batches, each prepped once.

Each item's prep draws a random number; two jobs holding equal random numbers for a batch proves the
batch was prepped once and shared. Jobs synchronise on events, never on sleeps: the only sleeps make
a job slow on purpose.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pytest
import torch

import coordl
from coordl.coordinated.job import Group

CTX = mp.get_context("fork")
N, BS = 48, 4
PER_EPOCH = N // BS
# A bound on "the others go on", not a speed claim: dead members are swept every 0.5 s and batches
# claimed by a dead producer are redone; the group's own wait timeout is 60 s.
FINISH_BOUND_S = 90
# The longest a job waits for a batch or a slot before CoordlTimeoutError; batches here take
# microseconds to prep, so 30 s only ever runs out when something is stuck.
GROUP_TIMEOUT_S = 30


class RandomPrep:
    """Items 0..N-1; prep returns (index, a random number drawn in the producer)."""

    def __len__(self) -> int:
        return N

    def fetch(self, index: int) -> bytes:
        return index.to_bytes(4, "little")

    def prep(self, raw: bytes, index: int) -> torch.Tensor:
        return torch.tensor([float(int.from_bytes(raw, "little")), torch.rand(()).item()])


def _job(directory: str, out, tag: str, epochs: int, **kw) -> None:
    """A job process: reports its batches, or its error (so the test fails at once, not at a bound)."""
    try:
        out.put((tag, _consume(directory, epochs, **kw)))
    except Exception as e:
        out.put((tag, f"{type(e).__name__}: {e}"))
        raise


def _consume(directory: str, epochs: int, *, joined=None, go=None, progress=None,
             delay_s: float = 0.0, stop_after: int | None = None) -> list:  # fmt: skip
    loader = coordl.DataLoader(RandomPrep(), batch_size=BS, shuffle=True, num_workers=1,
                               coordinate=Group("fault", directory=directory, timeout_s=GROUP_TIMEOUT_S))  # fmt: skip
    if joined is not None:
        joined.set()
    if go is not None:
        assert go.wait(60)
    seen, n = [], 0
    for _ in range(epochs):
        epoch = []
        for batch in loader:
            epoch.append([(int(i), round(float(r), 6)) for i, r in batch.tolist()])
            n += 1
            if progress is not None and n == stop_after:
                progress.set()
                time.sleep(600)  # parked: the test kills this job here
            time.sleep(delay_s)
        seen.append(epoch)
    loader.close()
    return seen


def _start(target_kwargs: list[dict], directory: Path):
    out = CTX.Queue()
    procs = {}
    for kw in target_kwargs:
        tag = kw.pop("tag")
        procs[tag] = CTX.Process(target=_job, args=(str(directory), out, tag), kwargs=kw)
        procs[tag].start()
    return out, procs


def _collect(out, procs, tags) -> dict[str, list]:
    results = dict(out.get(timeout=FINISH_BOUND_S) for _ in tags)
    errors = {t: r for t, r in results.items() if isinstance(r, str)}
    assert not errors, errors
    for t in tags:
        procs[t].join(30)
        assert procs[t].exitcode == 0, t
    return results


def _check_epoch(epoch: list) -> None:
    assert len(epoch) == PER_EPOCH
    assert sorted(i for batch in epoch for i, _ in batch) == list(range(N))  # every item once


def _no_group_files(directory: Path) -> bool:
    return not [f for f in os.listdir(directory) if f.startswith("coordl-grp-")]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "reaped",
    [True, pytest.param(False, marks=pytest.mark.slow)],
    ids=["reaped", "zombie"],
)
def test_killed_job_does_not_stop_the_others(tmp_path: Path, reaped: bool) -> None:
    joined = [CTX.Event() for _ in range(3)]
    go, parked = CTX.Event(), CTX.Event()
    specs = [
        {"tag": "a", "epochs": 2, "joined": joined[0], "go": go},
        {"tag": "b", "epochs": 2, "joined": joined[1], "go": go},
        {"tag": "victim", "epochs": 2, "joined": joined[2], "go": go, "progress": parked, "stop_after": 5},
    ]
    out, procs = _start(specs, tmp_path)
    assert all(e.wait(60) for e in joined)  # all three are members before anyone reads
    go.set()
    assert parked.wait(60)  # the victim holds batch 5 of epoch 0
    t0 = time.monotonic()
    os.kill(procs["victim"].pid, signal.SIGKILL)
    if reaped:  # its parent reaps it at once (a shell, a scheduler); else it stays a zombie meanwhile
        procs["victim"].join(30)
    results = _collect(out, procs, ["a", "b"])
    assert time.monotonic() - t0 < FINISH_BOUND_S
    procs["victim"].join(30)
    assert results["a"] == results["b"]  # the same batches, same random draws: prepped once, shared
    for epoch in results["a"]:
        _check_epoch(epoch)
    assert _no_group_files(tmp_path)


@pytest.mark.timeout(180)
def test_late_job_joins_at_an_epoch_boundary(tmp_path: Path) -> None:
    first_progress, late_joined = CTX.Event(), CTX.Event()
    out = CTX.Queue()
    first = CTX.Process(target=_late_first, args=(str(tmp_path), out, first_progress, late_joined))
    first.start()
    assert first_progress.wait(60)  # the first job is mid-epoch 0
    late = CTX.Process(target=_job, args=(str(tmp_path), out, "late", 1), kwargs={"joined": late_joined})
    late.start()
    results = _collect(out, {"first": first, "late": late}, ["first", "late"])
    for epoch in results["first"]:
        _check_epoch(epoch)
    (late_epoch,) = results["late"]
    _check_epoch(late_epoch)
    # A whole group epoch the first job also got (the current one while its batch 0 is still in the
    # ring, else the next): never the tail of one epoch and the head of another.
    assert late_epoch in results["first"]
    assert _no_group_files(tmp_path)


def _late_first(directory: str, out, progress, late_joined) -> None:
    """Three epochs; after 3 batches of epoch 0 it waits until the late job is a member."""
    loader = coordl.DataLoader(RandomPrep(), batch_size=BS, shuffle=True, num_workers=1,
                               coordinate=Group("fault", directory=directory, timeout_s=GROUP_TIMEOUT_S))  # fmt: skip
    seen = []
    for _ in range(3):
        epoch = []
        for batch in loader:
            epoch.append([(int(i), round(float(r), 6)) for i, r in batch.tolist()])
            if len(seen) == 0 and len(epoch) == 3:
                progress.set()
                assert late_joined.wait(60)
        seen.append(epoch)
    loader.close()
    out.put(("first", seen))


@pytest.mark.timeout(180)
def test_slow_job_makes_the_fast_one_wait_and_both_get_every_batch(tmp_path: Path) -> None:
    joined = [CTX.Event(), CTX.Event()]
    go = CTX.Event()
    specs = [
        {"tag": "fast", "epochs": 2, "joined": joined[0], "go": go},
        {"tag": "slow", "epochs": 2, "joined": joined[1], "go": go, "delay_s": 0.05},
    ]
    out, procs = _start(specs, tmp_path)
    assert all(e.wait(60) for e in joined)
    go.set()
    results = _collect(out, procs, ["fast", "slow"])
    assert results["fast"] == results["slow"]
    for epoch in results["fast"]:
        _check_epoch(epoch)
    assert results["fast"][0] != results["fast"][1]  # a fresh permutation (and fresh draws) per epoch
    assert _no_group_files(tmp_path)

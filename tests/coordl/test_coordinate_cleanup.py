"""Coordination groups leave no file behind: not the lock file, not after errors, not after kill -9."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch

from coordl.coordinated import control as gc
from coordl.coordinated.job import Group, GroupMember

CTX = mp.get_context("fork")


def _digest(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()[:16]


def _group_files(directory, name: str | None = None) -> list[str]:
    key = _digest(name) if name else "coordl-grp-"
    return sorted(f for f in os.listdir(directory) if key in f)


def _make_batch(indices: list[int]):
    return torch.tensor(indices, dtype=torch.float32)


def _member(directory, name: str = "g", slots: int = 4) -> GroupMember:
    return GroupMember(Group(name, slots=slots, timeout_s=60, directory=str(directory)), num_items=40,
                       batch_size=4, drop_last=False, shuffle=True, make_batch=_make_batch)  # fmt: skip


def _job(directory, epochs: int, fail: bool) -> None:
    m = _member(directory)
    for _ in range(epochs):
        for i, batch in enumerate(m.epoch()):
            assert batch.shape == (4,)
            if fail and i == 3:
                raise RuntimeError("the job fails mid-epoch and never calls close()")
    m.close()


def _run(targets) -> list[int]:
    procs = [CTX.Process(target=t, args=a) for t, a in targets]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    return [p.exitcode for p in procs]


def test_finished_jobs_leave_no_file_of_the_group(tmp_path):
    assert _run([(_job, (tmp_path, 2, False)), (_job, (tmp_path, 2, False))]) == [0, 0]
    assert _group_files(tmp_path, "g") == []


def test_a_job_failing_without_close_leaves_no_file(tmp_path):
    assert _run([(_job, (tmp_path, 1, True)), (_job, (tmp_path, 1, False))]) == [1, 0]
    assert _group_files(tmp_path, "g") == []


_EXIT_WITHOUT_CLOSE = """
import sys, torch
from coordl.coordinated.job import Group, GroupMember
m = GroupMember(Group("g", slots=4, directory=sys.argv[1]), num_items=40, batch_size=4, drop_last=False,
                shuffle=False, make_batch=lambda ix: torch.tensor(ix, dtype=torch.float32))
next(m.epoch())
print("member", flush=True)
"""


def test_a_job_exiting_without_close_leaves_no_file(tmp_path):
    done = subprocess.run([sys.executable, "-c", _EXIT_WITHOUT_CLOSE, str(tmp_path)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and "member" in done.stdout, done.stderr
    assert _group_files(tmp_path) == []


def _close_in_child(m: GroupMember) -> None:
    m.close()


def test_a_forked_childs_close_does_not_end_the_parents_membership(tmp_path):
    m = _member(tmp_path)
    assert _run([(_close_in_child, (m,))]) == [0]
    assert int(m._ctl.members[m._row, 0]) == os.getpid()
    assert len(_group_files(tmp_path, "g")) == 3
    m.close()
    assert _group_files(tmp_path) == []


def _failing_probe(indices: list[int]):
    raise RuntimeError("prep fails")


def test_a_failed_start_leaves_no_file(tmp_path):
    with pytest.raises(RuntimeError, match="prep fails"):
        GroupMember(Group("g", directory=str(tmp_path)), num_items=8, batch_size=4, drop_last=False,
                    shuffle=False, make_batch=_failing_probe)  # fmt: skip
    assert _group_files(tmp_path) == []


def _locker(directory, rounds: int, seed: int, errors) -> None:
    """Take the group lock repeatedly; sometimes remove the group while holding it, as the last leaver does."""
    base = os.path.join(str(directory), "coordl-grp-" + _digest("g"))
    held, counter = os.path.join(str(directory), "held"), os.path.join(str(directory), "counter")
    rng = random.Random(seed)
    for r in range(rounds):
        fd = gc.lock_group(base)
        try:
            try:  # exclusive create fails if another process believes it holds the lock too
                os.close(os.open(held, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                errors.put(f"two holders at round {r}")
                continue
            with open(counter) as f:
                n = int(f.read())
            with open(counter, "w") as f:
                f.write(str(n + 1))
            os.unlink(held)
            # Removing is the last thing a holder does under the lock (as in GroupMember.close): from
            # the moment the lock file is unlinked, a newcomer may lock a fresh one.
            if rng.random() < 0.5 or r == rounds - 1:
                gc.remove_group_files(base)
        finally:
            os.close(fd)


def test_lock_removal_never_lets_two_processes_hold_the_lock(tmp_path):
    (tmp_path / "counter").write_text("0")
    errors = CTX.Queue()
    procs, rounds = 4, 150
    assert _run([(_locker, (tmp_path, rounds, seed, errors)) for seed in range(procs)]) == [0] * procs
    assert errors.empty()
    assert int((tmp_path / "counter").read_text()) == procs * rounds  # no lost update
    assert _group_files(tmp_path) == []


def _joiner(directory, rounds: int, errors) -> None:
    held, counter = os.path.join(str(directory), "held"), os.path.join(str(directory), "counter")
    for r in range(rounds):
        m = _member(directory)
        with m._ctl.locked():
            try:
                os.close(os.open(held, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                errors.put(f"two members hold the group lock at round {r}")
            else:
                with open(counter) as f:
                    n = int(f.read())
                with open(counter, "w") as f:
                    f.write(str(n + 1))
                os.unlink(held)
            assert int(m._ctl.members[m._row, 0]) == os.getpid()
        m.close()


def test_members_joining_and_leaving_share_one_lock_and_leave_nothing(tmp_path):
    (tmp_path / "counter").write_text("0")
    errors = CTX.Queue()
    procs, rounds = 3, 4
    assert _run([(_joiner, (tmp_path, rounds, errors)) for _ in range(procs)]) == [0] * procs
    assert errors.empty()
    assert int((tmp_path / "counter").read_text()) == procs * rounds
    assert _group_files(tmp_path) == []


def _victim(directory, out) -> None:
    m = _member(directory)
    next(m.epoch())
    out.put([p.pid for p in m._producers])
    time.sleep(120)


def _kill_a_whole_group(directory) -> None:
    """Two members (each with a producer) of group "g", all killed with SIGKILL."""
    out = CTX.Queue()
    victims = [CTX.Process(target=_victim, args=(directory, out)) for _ in range(2)]
    for v in victims:
        v.start()
    producers = [pid for _ in victims for pid in out.get(timeout=60)]
    for v in victims:
        os.kill(v.pid, signal.SIGKILL)
        v.join(30)
    for pid in producers:  # they die with their job (parent-death signal); make sure, then wait for it
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + 60
    while any(psutil.pid_exists(p) for p in producers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _group_files(directory, "g") == [f"coordl-grp-{_digest('g')}.{e}" for e in ("ctl", "data", "lock")]


def test_next_join_of_a_killed_group_cleans_up(tmp_path):
    _kill_a_whole_group(tmp_path)
    m = _member(tmp_path, slots=2)  # a different slot count: the dead group is no obstacle
    assert len(list(m.epoch())) == 10
    m.close()
    assert _group_files(tmp_path) == []


def test_joining_another_group_reclaims_a_killed_group(tmp_path):
    _kill_a_whole_group(tmp_path)
    other = _member(tmp_path, name="other")
    assert _group_files(tmp_path, "g") == []
    other.close()
    assert _group_files(tmp_path) == []


def test_reclaim_keeps_a_live_group(tmp_path):
    m = _member(tmp_path)
    assert gc.reclaim_dead_groups(str(tmp_path)) == []
    assert len(_group_files(tmp_path, "g")) == 3
    m.close()
    assert _group_files(tmp_path) == []

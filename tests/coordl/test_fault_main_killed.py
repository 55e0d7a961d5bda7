"""Fault: the training process is killed with ``kill -9`` mid-epoch, then the job is started again.

Promise: its workers do not outlive it (bounded time), the shared memory it held (coordl's segments in
/dev/shm, a memcache LocalStore) is left behind by the kill but reclaimed by the next run, which works
normally and leaves nothing behind itself. Every process here is real; the new run is a new process.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
_PR_SET_CHILD_SUBREAPER = 36

# argv: mode ("victim" parks mid-epoch 2, "rerun" runs two epochs and exits), store directory.
SCRIPT = """
import os, sys, time
sys.path.insert(0, {root!r})
import psutil
import coordl
import memcache
from tests.coordl.ldr_sources import SplitSource
mode, store_dir = sys.argv[1], sys.argv[2]
store = memcache.LocalStore(8 << 20, name="killed9", directory=store_dir)
dl = coordl.DataLoader(SplitSource(60), batch_size=6, num_workers=2, persistent_workers=True,
                       cache_bytes=1 << 20, sample_cache=store)
assert sum(len(b) for b in dl) == 60
for i, batch in enumerate(dl):
    if i == 3 and mode == "victim":
        workers = [p.pid for p in psutil.Process().children()]
        print("PARKED", *workers, flush=True)
        time.sleep(600)
assert dl.stats()["sample_cache_hits"] >= 60, dl.stats()
dl.close()
store.close()
print("DONE", flush=True)
"""


def _segments_of(pid: int) -> list[str]:
    pattern = re.compile(rf"^coordl-[a-z0-9_]+-{pid}-")
    return [n for n in os.listdir("/dev/shm") if pattern.match(n)]


def _start(mode: str, store_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT.format(root=str(ROOT)), mode, str(store_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def subreaper():
    """Make this process the reaper of the victim's orphaned workers (as a container's PID 1 or a
    launcher is), so the test decides when their zombies are reaped instead of the host's init."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        pytest.skip("prctl(PR_SET_CHILD_SUBREAPER) is not available")
    adopted: list[int] = []
    try:
        yield adopted
    finally:
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        _reap(adopted)


def _reap(pids: list[int], timeout_s: float = 30.0) -> None:
    """Wait for (and reap) the adopted workers; 30 s bounds torch's 5 s parent-death watchdog."""
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while True:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                break  # not ours (reaped already, or never adopted)
            if done:
                break
            assert time.monotonic() < deadline, f"worker {pid} outlived its killed parent"
            time.sleep(0.05)


def _kill_a_parked_job(store_dir: Path) -> tuple[int, list[int], list[str]]:
    """Start a job, let it park mid-epoch, SIGKILL it. Returns (pid, worker pids, segments it held)."""
    victim = _start("victim", store_dir)
    try:
        line = victim.stdout.readline().split()
        assert line and line[0] == "PARKED", victim.stderr.read()[-3000:]
        workers = [int(p) for p in line[1:]]
        assert len(workers) == 2
        held = _segments_of(victim.pid)
        assert held  # cache, counters, worker table, batch ring
        assert os.listdir(store_dir)  # the LocalStore's file
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait(timeout=30)
    # kill -9 ran no cleanup. Any coordl process starting on this host may reclaim the dead job's
    # segments from here on (other tests, other jobs), so only "nothing new appeared" is certain.
    assert set(_segments_of(victim.pid)) <= set(held)
    return victim.pid, workers, held


def _rerun(store_dir: Path) -> int:
    rerun = _start("rerun", store_dir)
    out, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0 and "DONE" in out, err[-3000:]
    return rerun.pid


@pytest.mark.timeout(180)
def test_kill9_of_the_main_process_then_a_new_run(tmp_path: Path, subreaper: list[int]) -> None:
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    victim, workers, _ = _kill_a_parked_job(store_dir)
    subreaper.extend(workers)
    _reap(workers)  # the workers exit on their own once their parent is gone: no orphan keeps running
    rerun = _rerun(store_dir)
    assert _segments_of(victim) == []  # the next run (at the latest) reclaimed them
    assert _segments_of(rerun) == []  # and left none of its own
    assert os.listdir(store_dir) == []  # the store file: reclaimed, then removed at the last close


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_unreaped_workers_of_a_killed_job_do_not_pin_its_store(tmp_path: Path, subreaper: list[int]) -> None:
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    _, workers, _ = _kill_a_parked_job(store_dir)
    subreaper.extend(workers)
    deadline = time.monotonic() + 30  # they exit (torch's watchdog, 5 s) and stay zombies until reaped
    while any(psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in workers):
        assert time.monotonic() < deadline, f"workers {workers} outlived their killed parent"
        time.sleep(0.05)
    _rerun(store_dir)
    assert os.listdir(store_dir) == []

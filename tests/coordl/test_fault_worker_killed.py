"""Fault: a loader worker is killed from outside (the OOM killer, an operator's ``kill -9``) mid-epoch.

Promise: the training loop gets a ``WorkerDiedError`` that names the item the worker was preparing and
the signal, within a bounded time (no hang), and no worker process of the loader outlives it.

The worker is not killed by its own code (tests/coordl/test_worker_death.py covers that): it is parked
on item ``K`` and the test process sends SIGKILL to its pid, as the kernel's OOM killer would.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch

import coordl
from coordl.errors import WorkerDiedError
from tests.coordl.ldr_sources import MemorySource, decode

K = 13  # the item the worker is preparing when it dies: batch 3 of 10, mid-epoch
# torch notices a dead worker when a queue wait times out (every 5 s) or through its SIGCHLD handler;
# 30 s is six of those intervals, a bound on "no hang", not a speed claim.
DETECT_BOUND_S = 30.0


class ParkedSource(MemorySource):
    """Item ``K``'s prep writes the worker's pid to ``marker`` and then waits (up to 10 minutes) to be killed."""

    def __init__(self, n: int, marker: str) -> None:
        super().__init__(n)
        self.marker = marker

    def prep(self, raw: bytes, index: int) -> torch.Tensor:
        if index == K and not os.path.exists(self.marker + ".done"):
            tmp = f"{self.marker}.{os.getpid()}"
            with open(tmp, "w") as f:
                f.write(str(os.getpid()))
            os.replace(tmp, self.marker)  # the test never reads a half-written pid
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                time.sleep(0.05)
        return decode(raw, index, self.describe(index))


def _kill_when_parked(marker: Path, killed: dict) -> None:
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not marker.exists():
        killed["error"] = "no worker reached item K within 60 s"
        return
    pid = int(marker.read_text())
    killed["pid"] = pid
    killed["t"] = time.monotonic()
    os.kill(pid, signal.SIGKILL)


def _loader_children() -> set[int]:
    return {c.pid for c in psutil.Process().children(recursive=True)}


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "options",
    [
        {"num_workers": 2},
        {"num_workers": 2, "persistent_workers": True},
        {"num_workers": 1, "batch_ring": False},
        {"num_workers": 2, "cache_bytes": 1 << 20},
    ],
    ids=["ring", "persistent", "no-ring", "minio"],
)
def test_worker_killed_from_outside_names_item_and_does_not_hang(tmp_path: Path, options: dict) -> None:
    marker = tmp_path / "parked"
    src = ParkedSource(40, str(marker))
    killed: dict = {}
    with coordl.DataLoader(src, batch_size=4, **options) as dl:
        killer = threading.Thread(target=_kill_when_parked, args=(marker, killed), daemon=True)
        killer.start()
        with pytest.raises(WorkerDiedError) as info:
            for _ in dl:
                pass
        raised_at = time.monotonic()
        killer.join(10)
        assert "error" not in killed, killed["error"]
        assert raised_at - killed["t"] < DETECT_BOUND_S
        msg = str(info.value)
        assert f"mem://item-{K}.bin" in msg, msg  # the item, by its address
        assert "SIGKILL" in msg and f"worker pid {killed['pid']}" in msg, msg
        # The loader is usable again: the next epoch starts fresh workers and completes.
        Path(str(marker) + ".done").touch()
        assert sum(len(b) for b in dl) == 40


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_no_sibling_worker_outlives_the_error(tmp_path: Path) -> None:
    marker = tmp_path / "parked"
    before = _loader_children()
    killed: dict = {}
    kept = []  # what a logger or a notebook does: keep the error with its traceback
    with coordl.DataLoader(ParkedSource(40, str(marker)), batch_size=4, num_workers=2) as dl:
        threading.Thread(target=_kill_when_parked, args=(marker, killed), daemon=True).start()
        try:
            for _ in dl:
                pass
        except WorkerDiedError as e:
            kept.append(e)
    assert kept and "error" not in killed
    # Bound: torch's own shutdown joins each worker for at most 5 s before terminating it.
    deadline = time.monotonic() + 20
    while _loader_children() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (_loader_children() - before)

"""shmem.members: rows of dead processes are recognised (kill -9, pid reuse) and cleared."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from shmem import members
from shmem.segment import start_ticks


def test_join_leave_and_live() -> None:
    rows = np.zeros((3, 4), dtype=np.int64)
    r = members.join(rows)
    assert rows[r, 0] == os.getpid() and rows[r, 1] == start_ticks(os.getpid())
    rows[r, 2:] = (7, 9)  # callers keep their own columns after the two
    assert members.live_pids(rows) == [os.getpid()]
    members.leave(rows)
    assert not rows.any()


def test_a_killed_process_is_swept_and_its_row_reused() -> None:
    rows = np.zeros((2, 2), dtype=np.int64)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        members.join(rows, child.pid)
        members.join(rows)
        with pytest.raises(RuntimeError, match="demo table: all 2 rows"):
            members.join(rows, what="demo table")
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert members.sweep(rows) == 1
    assert members.live_pids(rows) == [os.getpid()]


def test_a_reused_pid_is_not_taken_for_the_dead_member() -> None:
    rows = np.zeros((1, 2), dtype=np.int64)
    rows[0] = (os.getpid(), start_ticks(os.getpid()) - 500)  # same pid, another start time: a reuse
    assert members.live_pids(rows) == [] and members.sweep(rows) == 1

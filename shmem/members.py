"""Tables of member processes in shared memory: the one dead-owner scheme for state shared by many processes.

A segment owned by one process carries its owner in its name (:mod:`shmem.segment`). State that many
processes share (a sample store every job of a node attaches to, a coordination group's jobs and
producers) keeps a table of rows whose first two columns are ``(pid, start ticks)``: a row whose
process is gone, even after ``kill -9``, is recognised by :func:`shmem.segment.owner_alive` (pid reuse
cannot fool it) and cleared by :func:`sweep`; when no row is live, the state can be removed.

Callers hold their own lock around every function here; rows may carry more columns after the two.
"""

from __future__ import annotations

import os

import numpy as np

from shmem.segment import owner_alive, start_ticks

__all__ = ["join", "leave", "live_pids", "sweep"]


def sweep(rows: np.ndarray) -> int:
    """Clear the rows of processes that are gone; returns how many were cleared."""
    cleared = 0
    for row in rows:
        if row[0] and not owner_alive(int(row[0]), int(row[1])):
            row[:] = 0
            cleared += 1
    return cleared


def live_pids(rows: np.ndarray) -> list[int]:
    """Pids of the rows whose process is alive (dead rows are left as they are)."""
    return [int(r[0]) for r in rows if r[0] and owner_alive(int(r[0]), int(r[1]))]


def join(rows: np.ndarray, pid: int | None = None, what: str = "table") -> int:
    """Sweep, then take the first free row for ``pid`` (default: this process); returns its index.

    Raises RuntimeError naming ``what`` when every row belongs to a live process.
    """
    pid = os.getpid() if pid is None else pid
    sweep(rows)
    free = np.flatnonzero(rows[:, 0] == 0)
    if not free.size:
        raise RuntimeError(f"{what}: all {len(rows)} rows belong to live processes")
    row = int(free[0])
    rows[row, 1] = start_ticks(pid)
    rows[row, 0] = pid
    return row


def leave(rows: np.ndarray, pid: int | None = None) -> None:
    """Clear one row of ``pid`` (default: this process): one row per handle, others keep theirs."""
    pid = os.getpid() if pid is None else pid
    mine = np.flatnonzero(rows[:, 0] == pid)
    if mine.size:
        rows[mine[0]] = 0

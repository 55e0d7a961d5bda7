"""Named int64 counters summed across every process that holds them (the loader and its workers).

``loader.stats()`` must count what all workers did. Each process claims a private row of a
shared-memory table once (under a file lock) and then adds to it without locking; a read sums the
rows. A row whose owner died keeps its counts, and is folded into a reserve row when rows run out, so
non-persistent workers that come and go every epoch never lose what they counted.

Totals only grow. :meth:`SharedCounters.reset` does not write the rows (a worker adding to its row at
that moment would write its old count back): it takes the totals as this object's zero, and a read
subtracts them. A read holds the file lock, so that a row being folded is never counted twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable, Iterator

import numpy as np

from shmem.forklock import PID, ForkSafeLock
from shmem.segment import DEFAULT_DIR, Segment, owner_alive, start_ticks

__all__ = ["SharedCounters"]

_ROWS = 128
_HEADER = 2  # per row: owner pid, owner start ticks


class SharedCounters:
    """A fixed set of named counters shared by a process and its (forked or spawned) children.

    Args:
        names: the counter names, fixed at creation.
        directory: where the backing segment lives (``/dev/shm`` by default).

    Picklable: a worker that unpickles it attaches to the same table.
    """

    def __init__(self, names: Iterable[str], directory: str | os.PathLike = DEFAULT_DIR) -> None:
        self.names = tuple(dict.fromkeys(names))
        width = _HEADER + len(self.names)
        self._segment = Segment.create("ctr", _ROWS * width * 8, directory)
        self._segment.reserve(0, self._segment.size)
        self._attach()
        self._zero = np.zeros(len(self.names), dtype=np.int64)

    def _attach(self) -> None:
        width = _HEADER + len(self.names)
        self._table = self._segment.array(np.int64, 0, _ROWS * width).reshape(_ROWS, width)
        self._slot = {n: _HEADER + i for i, n in enumerate(self.names)}  # name -> its word in a row
        self._mine: memoryview | None = None  # the row of process ``_mine_pid``, claimed at its first add
        self._mine_pid = -1
        self._thread_lock = ForkSafeLock()  # a worker forked while a fetch thread counted gets it released

    def _my_row(self) -> memoryview:
        """This process's row (claimed under the file lock at the first add; a forked child claims its own)."""
        pid = PID[0]
        if self._mine is not None and self._mine_pid == pid:
            return self._mine
        start = start_ticks(pid)
        with self._file_locked():
            free = [r for r in range(1, _ROWS) if self._table[r, 0] == 0]
            if not free:
                self._fold_dead_rows()
                free = [r for r in range(1, _ROWS) if self._table[r, 0] == 0]
            if not free:
                raise RuntimeError(f"more than {_ROWS - 1} live processes share counters {self.names}")
            r = free[0]
            self._table[r, 2:] = 0
            self._table[r, 1] = start
            self._table[r, 0] = pid
        # A memoryview, not the numpy row: an element's += is 3x faster, and it runs once or more per item.
        self._mine, self._mine_pid = memoryview(self._table[r]), pid
        return self._mine

    def _fold_dead_rows(self) -> None:
        # Row 0 is the reserve: counts of processes that exited, kept so totals never go down.
        for r in range(1, _ROWS):
            pid, start = int(self._table[r, 0]), int(self._table[r, 1])
            if pid and not owner_alive(pid, start):
                self._table[0, 2:] += self._table[r, 2:]
                self._table[r, :] = 0

    def add(self, name: str, amount: int = 1) -> None:
        """Add ``amount`` to counter ``name`` (no file lock after the first call in a process)."""
        with self._thread_lock:  # += on a row element is read-modify-write: a worker's fetch threads
            self._my_row()[self._slot[name]] += amount

    def add_many(self, amounts: dict[str, int]) -> None:
        with self._thread_lock:
            row, slot = self._my_row(), self._slot
            for name, amount in amounts.items():
                row[slot[name]] += amount

    @contextlib.contextmanager
    def _file_locked(self) -> Iterator[None]:
        """The table's file lock (claiming a row, folding dead rows, reading totals)."""
        with os.fdopen(self._segment.reopen(), "rb") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _totals(self) -> np.ndarray:
        with self._file_locked():  # not while _my_row folds a dead row into the reserve
            return self._table[:, _HEADER:].sum(axis=0)

    def snapshot(self) -> dict[str, int]:
        """Current totals over all processes since the last :meth:`reset`, by name."""
        totals = self._totals() - self._zero
        return {n: int(totals[i]) for i, n in enumerate(self.names)}

    def live_snapshot(self) -> dict[str, int]:
        """What the processes running now counted, by name: the rows of processes that exited (and the
        reserve) left out, and not since :meth:`reset`. E.g. work a process queued and has not finished,
        where a process that died never will."""
        with self._file_locked():
            owners = [(r, int(self._table[r, 0]), int(self._table[r, 1])) for r in range(1, _ROWS)]
            rows = [r for r, pid, start in owners if pid and owner_alive(pid, start)]
            totals = self._table[rows, _HEADER:].sum(axis=0)
        return {n: int(totals[i]) for i, n in enumerate(self.names)}

    def reset(self) -> None:
        """Count from zero again: later snapshots leave out what was counted before (rows stay as they are)."""
        self._zero = self._totals()

    def close(self) -> None:
        self._mine = None
        self._table = np.empty((0, 0), np.int64)  # drop the views before unmapping
        self._segment.close()

    def __getstate__(self) -> dict:
        return {"names": self.names, "segment": self._segment, "zero": self._zero.tolist()}

    def __setstate__(self, state: dict) -> None:
        self.names = state["names"]
        self._segment = state["segment"]
        self._attach()
        self._zero = np.array(state["zero"], dtype=np.int64)

"""Which item each loader worker is on, so a worker's death can be reported by the item that killed it.

torch reports a dead worker as "DataLoader worker (pid 123) is killed by signal: ..." and nothing more:
the user cannot tell which file crashed the decoder or blew the memory. Each worker writes its pid and
the index of the item it is preparing into its own row of a tiny shared table (two int64 stores per
item, no lock); when torch reports the death, the main process looks the pid up and names the item.
"""

from __future__ import annotations

import functools
import os
import re
import signal
from collections.abc import Callable
from typing import Any

import numpy as np

from coordl.datasets.source import describe_item
from coordl.errors import CoordlTimeoutError, WorkerDiedError
from coordl.shutdown import WORKER_PIDS_RE, is_worker_death, worker_death
from shmem.forklock import PID
from shmem.segment import DEFAULT_DIR, Segment

__all__ = ["WorkerWatch", "is_worker_death", "translate_torch_error", "worker_died_error"]

_IDLE = -1
_PIDS_RE = WORKER_PIDS_RE


_MIN_ROWS = 64


class WorkerWatch:
    """A shared table of ``(pid, current item)`` per worker id.

    Args:
        num_workers: the loader's ``num_workers``; one row each (at least 64 rows).
        directory: where the table lives (``/dev/shm`` by default).
    """

    def __init__(self, num_workers: int, directory: str | os.PathLike = DEFAULT_DIR) -> None:
        # Room beyond num_workers: a profiler may rerun the same loader with more workers.
        self.num_workers = max(_MIN_ROWS, int(num_workers))
        self._segment = Segment.create("watch", self.num_workers * 2 * 8, directory)
        self._segment.reserve(0, self._segment.size)
        self._attach()
        self._table[:, 1] = _IDLE

    def _attach(self) -> None:
        self._table = self._segment.array(np.int64, 0, self.num_workers * 2).reshape(self.num_workers, 2)
        self._words = self._table.reshape(-1).data  # the same words, flat: cheaper per store

    def on_item(self, worker_id: int, index: int) -> None:
        """Record that ``worker_id`` (this process) now works on item ``index``."""
        if worker_id >= self.num_workers:
            return  # bookkeeping only: never fail a load for it
        words = self._words
        words[2 * worker_id] = PID[0]  # kept by a fork hook: on_item runs once per item
        words[2 * worker_id + 1] = index

    def item_writer(self, worker_id: int) -> Callable[[int], None] | None:
        """:meth:`on_item` for the batch being made by ``worker_id`` (this process): its pid written now,
        then one store per item (a C call, no Python function per item); None past the table's rows."""
        if worker_id >= self.num_workers:
            return None
        words = self._words
        words[2 * worker_id] = PID[0]
        return functools.partial(words.__setitem__, 2 * worker_id + 1)

    def idle(self, worker_id: int) -> None:
        if worker_id < self.num_workers:
            self._table[worker_id, 1] = _IDLE

    def item_of(self, pid: int) -> int | None:
        """The item the worker with ``pid`` was on when last seen, or None."""
        for wpid, index in self._table:
            if int(wpid) == pid and int(index) != _IDLE:
                return int(index)
        return None

    def close(self) -> None:
        # Drop the views before unmapping: empty ones, so a closed watch knows no item.
        self._table, self._words = np.empty((0, 2), np.int64), memoryview(b"").cast("q")
        self._segment.close()

    def __getstate__(self) -> dict:
        return {"num_workers": self.num_workers, "segment": self._segment}

    def __setstate__(self, state: dict) -> None:
        self.num_workers = state["num_workers"]
        self._segment = state["segment"]
        self._attach()


def worker_died_error(
    error: BaseException, watch: WorkerWatch | None, source: object, exitcodes: dict[int, int | None]
) -> WorkerDiedError:
    """A :class:`WorkerDiedError` naming each dead worker's pid, how it died, and its item."""
    m = _PIDS_RE.search(str(error))
    pids = [int(p) for p in m.group(1).replace(" ", "").split(",") if p] if m else []
    parts = []
    for pid in pids:
        how = _describe_exit(exitcodes.get(pid), str(error))
        index = watch.item_of(pid) if watch is not None else None
        what = describe_item(source, index) if index is not None else "no item (between items)"
        parts.append(f"worker pid {pid} {how} while preparing {what}")
    detail = "; ".join(parts) or "no worker named"
    # torch's own words first: code that matches torch's message ("DataLoader worker (pid 123) is killed
    # by signal: ...", "... exited unexpectedly") still matches.
    return WorkerDiedError(
        f"{str(error).rstrip('. ')}: {detail}. Common causes: out of memory (check dmesg for the OOM killer, "
        f"lower num_workers or batch_size), a crash in a native decoder on this item, or a full /dev/shm "
        f"(use cache_dir= or docker run --shm-size=...)."
    )


def _describe_exit(exitcode: int | None, message: str) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"was killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    if exitcode is not None:
        return f"exited with code {exitcode}"
    m = re.search(r"killed by signal: ([^.]+)", message)
    return f"was killed by signal ({m.group(1)})" if m else "exited unexpectedly"


def translate_torch_error(
    error: Exception, torch_iter: Any, watch: WorkerWatch | None, source: Any
) -> BaseException | None:
    """coordl's error for one of torch's ``RuntimeError``s (a worker's death, a timeout), else None.

    A worker's death is recognised by :func:`coordl.shutdown.worker_death`, also when it surfaced as the
    data queue's ``ConnectionError`` or ``EOFError``.
    """
    death = worker_death(error, torch_iter)
    if death is not None:
        exitcodes = {w.pid: w.exitcode for w in getattr(torch_iter, "_workers", [])}
        return worker_died_error(death, watch, source, exitcodes)
    if "DataLoader timed out after" in str(error):
        return CoordlTimeoutError(f"{error} (the timeout= option of coordl.DataLoader)")
    return None

"""Forked loader workers stuck inside ``os.fork()``: noticed and replaced while the epoch runs.

CPython before 3.11.10 (and before 3.12.0 on that line) can deadlock a forked child inside ``os.fork()``
(gh-112275): when another thread of the parent is creating its thread state at the instant of the fork,
the child inherits the interpreter's thread-list lock held and waits on it forever. torch's C++ threads
create one whenever they drop the last reference to a Python object (gloo's work threads after every
collective: under DDP, right around an epoch's first fork). torch's loader then waits for that worker's
batch forever, without a message. Measured with ``tests/coordl/workers/fork_race_job.py`` on CPython
3.11.7: torch's own loader hung 2 epochs in 300 (600 forks).

A stuck worker never reaches its ``worker_init_fn``, where each of coordl's workers first writes its pid
(:class:`coordl.workers.start.ShowUserDataset`). A thread (:class:`StartWatch`) follows the workers an
epoch has just forked until each has written it. One that has not after :data:`STUCK_AFTER_S`, sleeps
and used no CPU for :data:`LOOK_EVERY_S` is stopped (``SIGSTOP``); if it still has not written it, it
has read no index (torch's workers read them only after ``worker_init_fn``), so a new process with the
same arguments takes its place (the same worker id and seed, the same queues: the indices already sent
wait in its queue's pipe) and the stuck one is killed. The epoch's batches are the ones it would have
had. The thread works beside the main process's ``next()``, so an error torch reports there (a worker
that died) is raised there, as torch raises it.
"""

from __future__ import annotations

import logging
import multiprocessing.context
import os
import signal
import threading
import time
import weakref
from typing import Any

import psutil
from torch.utils.data import _utils as torch_data_utils

from shmem.flag import SharedFlag

__all__ = ["KEEP_ARGS", "LOOK_EVERY_S", "MAX_RESTARTS", "STUCK_AFTER_S", "StartWatch"]

log = logging.getLogger("coordl")

# A worker that has not started after this long, sleeps and uses no CPU, is taken for stuck.
STUCK_AFTER_S = 2.0
LOOK_EVERY_S = 0.5
# Replacements tried for one worker before it is killed and the epoch fails as torch's does.
MAX_RESTARTS = 3


class _KeepArgsProcess(multiprocessing.context.ForkProcess):
    """A forked process that keeps what it was started with (``Process.start`` drops it): what its
    replacement is started with."""

    start_args: tuple[Any, tuple, dict] | None = None

    def start(self) -> None:
        # typeshed leaves out BaseProcess's private fields (set by its __init__ on every Python version)
        self.start_args = (self._target, self._args, self._kwargs)  # type: ignore[attr-defined]
        super().start()


class _KeepArgsContext(multiprocessing.context.ForkContext):
    Process = _KeepArgsProcess

    # SharedFlag has Event's methods (set, is_set, clear, wait) without being one: what torch calls.
    def Event(self) -> SharedFlag:  # type: ignore[override]  # noqa: N802 - multiprocessing's name
        """torch's ``_workers_done_event``: a flag no killed worker can leave locked (:mod:`shmem.flag`)."""
        return SharedFlag(self)


KEEP_ARGS = _KeepArgsContext()  # the fork context torch's loader is given while coordl forks its workers


class StartWatch:
    """Follows the workers torch's iterator ``it`` has just forked until each has started; replaces one
    stuck inside the fork (see the module docstring).

    Args:
        it: torch's iterator, just made.
        started_pid: ``worker id -> the pid that worker wrote at its start`` (0: none yet).
        running: pids of workers that were running before (persistent ones): not followed.
    """

    def __init__(self, it: Any, started_pid: Any, running: set[int] | frozenset = frozenset()) -> None:
        self.started_pid = started_pid
        workers = list(getattr(it, "_workers", None) or ())
        self.pending = {i for i, w in enumerate(workers) if w.pid not in running and started_pid(i) != w.pid}
        self.thread: threading.Thread | None = None
        if self.pending:
            self.thread = threading.Thread(
                target=self._follow, args=(weakref.ref(it),), name="coordl-worker-start", daemon=True
            )
            self.thread.start()

    def _follow(self, ref: weakref.ref) -> None:
        restarts = dict.fromkeys(self.pending, 0)
        since = dict.fromkeys(self.pending, time.monotonic())
        looks: dict[int, tuple[float, float]] = {}  # worker -> (when, its CPU seconds then)
        while self.pending:
            time.sleep(0.002)
            it = ref()
            if it is None or getattr(it, "_shutdown", False):
                return  # torch stops (and reaps) its workers itself
            for i in sorted(self.pending):
                worker = it._workers[i]
                if self.started_pid(i) == worker.pid:
                    self.pending.discard(i)
                elif time.monotonic() - since[i] < STUCK_AFTER_S:
                    continue
                elif (stuck := self._stuck(i, worker.pid, looks)) is None:
                    self.pending.discard(i)  # it died: torch reports that in next()
                elif stuck:
                    if restarts[i] == MAX_RESTARTS or getattr(worker, "start_args", None) is None:
                        self.pending.discard(i)
                        self._give_up(i, worker, restarts[i])
                        continue
                    _replace(it, i)
                    restarts[i] += 1
                    since[i] = time.monotonic()
                    looks.pop(i, None)
            del it

    def _stuck(self, i: int, pid: int, looks: dict[int, tuple[float, float]]) -> bool | None:
        """Worker ``i`` sleeps and used no CPU since a look at least :data:`LOOK_EVERY_S` ago; confirmed
        with it stopped, so that it cannot take its first step between this look and the kill. None: it
        has exited."""
        now = time.monotonic()
        last = looks.get(i)
        if last is not None and now - last[0] < LOOK_EVERY_S:
            return False
        try:
            proc = psutil.Process(pid)
            used = sum(proc.cpu_times()[:2])
            status = proc.status()
        except psutil.Error:
            return None
        if status == psutil.STATUS_ZOMBIE:
            return None
        looks[i] = (now, used)
        if last is None or used != last[1] or status != psutil.STATUS_SLEEPING:
            return False
        os.kill(pid, signal.SIGSTOP)
        if self.started_pid(i) == pid:
            os.kill(pid, signal.SIGCONT)
            return False
        return True

    @staticmethod
    def _give_up(i: int, worker: Any, restarts: int) -> None:
        """Kill it: torch reports the death in ``next()`` (coordl: :class:`coordl.errors.WorkerDiedError`)."""
        why = (
            f"and so were {restarts} processes started in its place"
            if restarts
            else "and cannot be replaced (the loader's multiprocessing_context is the program's own)"
        )
        log.error(
            "coordl: DataLoader worker %d (pid %d) was stuck inside os.fork() %s; killing it (CPython before "
            "3.11.10 can deadlock a child forked while another thread creates its thread state: gh-112275)",
            i, worker.pid, why,
        )  # fmt: skip
        os.kill(worker.pid, signal.SIGKILL)


def _replace(it: Any, i: int) -> None:
    """A new worker process in place of the stopped, stuck worker ``i`` of torch's iterator ``it``."""
    old = it._workers[i]
    target, args, kwargs = old.start_args
    new = _KeepArgsProcess(target=target, args=args, kwargs=kwargs, daemon=True)
    new.start()
    it._workers[i] = new
    # torch's SIGCHLD handler must not report the stuck one's death as a failed worker
    if getattr(it, "_worker_pids_set", False):
        torch_data_utils.signal_handling._remove_worker_pids(id(it))
        torch_data_utils.signal_handling._set_worker_pids(id(it), tuple(w.pid for w in it._workers))
    log.warning(
        "coordl: DataLoader worker %d (pid %d) was stuck inside os.fork() (CPython before 3.11.10 can "
        "deadlock a child forked while another thread creates its thread state: gh-112275); "
        "started pid %d in its place",
        i, old.pid, new.pid,
    )  # fmt: skip
    old.kill()
    old.join(5)

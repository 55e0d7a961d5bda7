"""Stopping torch's loader workers, where a worker's death seen during the stop is no error.

torch's ``_shutdown_workers()`` sets the done event, joins each worker for a moment and terminates the
ones still running. Its SIGCHLD handler can still report a worker that died meanwhile, by raising
"DataLoader worker (pid N) is killed by signal: ..." in the main process, in the middle of that stop.
Every batch that worker made had been handed out or was to be dropped: the stop was asked for
(``close()``, a new pass of a resumed loader, an epoch ended early), so coordl finishes the stop, logs
the death, and goes on (issue 63: a resumed pass raised ``WorkerDiedError`` instead of its first batch).

A death during an epoch is an error, and :func:`worker_death` recognises it in every form ``next()`` on
torch's iterator raises it: torch's own report, or the data queue's reset when the worker dies while the
main process unpickles its batch (torch's file-descriptor sharing asks the worker for the fd). The kernel
closes a killed process's sockets before its parent can see it exited, so torch's own check of the workers
may find them all alive and re-raise the bare ``ConnectionResetError``; here that check waits for the exit.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

__all__ = ["is_worker_death", "stop_workers", "worker_death"]

log = logging.getLogger("coordl")

WORKER_PIDS_RE = re.compile(r"DataLoader worker \(pid\(?s?\)? ([\d, ]+)\)")
_JOIN_S = 5.0  # a worker already told to stop, or terminated, exits in milliseconds
_EXIT_SEEN_S = 1.0  # from a killed worker's socket reset to its exit being seen: microseconds to ms


def is_worker_death(error: BaseException) -> bool:
    """True for the RuntimeErrors torch raises when a worker process dies."""
    return (
        isinstance(error, RuntimeError)
        and WORKER_PIDS_RE.search(str(error)) is not None
        and ("exited unexpectedly" in str(error) or "killed by signal" in str(error))
    )


def worker_death(error: BaseException, torch_iter: Any) -> RuntimeError | None:
    """torch's report of the worker death behind ``error``, raised by ``next()`` on ``torch_iter`` (torch's
    multi-process iterator), or None when ``error`` is not a worker's death.

    Its words are torch's ("DataLoader worker (pid(s) N) exited unexpectedly" or "... is killed by signal:
    ..."), so code that matches torch's message still matches. A ``ConnectionError`` or ``EOFError`` from the
    data queue is a death when a worker has exited, waited for briefly; torch's SIGCHLD handler may raise
    its own report of the death inside that wait, which is then the answer.
    """
    if is_worker_death(error):
        return error  # type: ignore[return-value]
    if not isinstance(error, (ConnectionError, EOFError)):
        return None
    workers = list(getattr(torch_iter, "_workers", []))
    deadline = time.monotonic() + _EXIT_SEEN_S
    try:
        while workers and all(w.is_alive() for w in workers) and time.monotonic() < deadline:
            time.sleep(0.02)
        dead = [w.pid for w in workers if not w.is_alive()]
    except RuntimeError as death:
        if not is_worker_death(death):
            raise
        return death
    if not dead:
        return None
    return RuntimeError(
        f"DataLoader worker (pid(s) {', '.join(map(str, dead))}) exited unexpectedly ({error!r})"
    )


def stop_workers(torch_iter: Any) -> None:
    """Stop the workers of torch's multi-process iterator ``torch_iter`` (no-op for any other iterator);
    a worker's death reported while they stop is logged, and the stop completed."""
    if not hasattr(torch_iter, "_shutdown_workers"):
        return
    try:
        torch_iter._shutdown_workers()
    except RuntimeError as error:
        if not is_worker_death(error):
            raise
        log.warning("coordl: %s, while the loader's workers were being stopped; the stop went on", error)
        _finish_stop(torch_iter)


def _finish_stop(torch_iter: Any) -> None:
    """What torch's stop leaves undone when the death's report cut it short: its ``finally`` forgot the
    pids and terminated the workers still running; here each is reaped and the index queues closed."""
    torch_iter._workers_done_event.set()
    for w in getattr(torch_iter, "_workers", ()):
        w.join(_JOIN_S)
        if w.is_alive():
            w.kill()
            w.join(_JOIN_S)
    for q in getattr(torch_iter, "_index_queues", ()):
        q.cancel_join_thread()
        q.close()

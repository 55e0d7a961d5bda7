"""Stopping torch's loader workers, where a worker's death seen during the stop is no error.

torch's ``_shutdown_workers()`` sets the done event, joins each worker for a moment and terminates the
ones still running. Its SIGCHLD handler can still report a worker that died meanwhile, by raising
"DataLoader worker (pid N) is killed by signal: ..." in the main process, in the middle of that stop.
Every batch that worker made had been handed out or was to be dropped: the stop was asked for
(``close()``, a new pass of a resumed loader, an epoch ended early), so coordl finishes the stop, logs
the death, and goes on (issue 63: a resumed pass raised ``WorkerDiedError`` instead of its first batch).
"""

from __future__ import annotations

import logging
import re
from typing import Any

__all__ = ["is_worker_death", "stop_workers"]

log = logging.getLogger("coordl")

WORKER_PIDS_RE = re.compile(r"DataLoader worker \(pid\(?s?\)? ([\d, ]+)\)")
_JOIN_S = 5.0  # a worker already told to stop, or terminated, exits in milliseconds


def is_worker_death(error: BaseException) -> bool:
    """True for the RuntimeErrors torch raises when a worker process dies."""
    return (
        isinstance(error, RuntimeError)
        and WORKER_PIDS_RE.search(str(error)) is not None
        and ("exited unexpectedly" in str(error) or "killed by signal" in str(error))
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

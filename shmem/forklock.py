"""A thread lock that a forked child gets released, whatever the parent's threads held at the fork.

``fork()`` copies one thread but every lock: a ``threading.Lock`` that another thread of the parent
held at that moment stays held in the child forever, and the child's first ``with lock:`` hangs (a
loader worker forked while the main process's fetch or counter thread was inside its lock). Each
:class:`ForkSafeLock` is made anew in the child by an ``os.register_at_fork`` hook, before the child
runs anything else. Use it for locks that guard per-process state; it does not order the child against
the parent (they share nothing a thread lock could guard).
"""

from __future__ import annotations

import os
import threading
import weakref
from types import TracebackType

__all__ = ["PID", "ForkSafeLock"]

_LIVE: weakref.WeakSet[ForkSafeLock] = weakref.WeakSet()

# This process's pid, kept current by the fork hook below: code that runs per item reads ``PID[0]``
# instead of calling ``os.getpid()`` (a system call) each time.
PID = [os.getpid()]


class ForkSafeLock:
    """``threading.Lock`` semantics (``with``, ``acquire``, ``release``); released in a forked child."""

    __slots__ = ("_lock", "__weakref__")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        _LIVE.add(self)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._lock.release()


def _renew_after_fork() -> None:
    PID[0] = os.getpid()
    for lock in list(_LIVE):
        lock._lock = threading.Lock()


os.register_at_fork(after_in_child=_renew_after_fork)

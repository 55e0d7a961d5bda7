"""A flag shared by a process and its children that no process can leave locked: ``Event`` without a lock.

``multiprocessing.Event`` takes a lock even to read itself (``is_set()``). A process killed in that
instant (``kill -9``, the OOM killer, the SIGTERM multiprocessing sends daemons at exit) leaves the lock
held, and every later ``is_set()`` or ``set()`` waits forever: torch's loader hung in
``_shutdown_workers``, and a coordinated job in ``close()``. :class:`SharedFlag` is one byte of shared
memory: reading and writing it are single stores and loads, so there is nothing to leave held.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["SharedFlag"]


class SharedFlag:
    """``is_set``, ``set``, ``clear`` and ``wait`` of ``multiprocessing.Event`` on one shared byte.

    Args:
        ctx: the multiprocessing context of the processes that share it (passed to them when they
            start, as an Event is: inherited by a fork, pickled for a spawn while it starts).
    """

    POLL_S = 0.005  # wait() polls: nobody here waits on the flag, they check it between steps

    def __init__(self, ctx: Any) -> None:
        self._value = ctx.RawValue("b", 0)

    def is_set(self) -> bool:
        return bool(self._value.value)

    def set(self) -> None:
        self._value.value = 1

    def clear(self) -> None:
        self._value.value = 0

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(self.POLL_S)
        return True

"""ForkSafeLock: a child forked while another thread holds the lock gets it released."""

from __future__ import annotations

import os
import threading

from shmem.counters import SharedCounters
from shmem.forklock import ForkSafeLock


def _fork_and(check) -> int:
    """Fork; the child exits 0 if ``check()`` is true within its own alarm, else 1 (or dies by the alarm)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            import signal

            signal.alarm(10)  # a hang is a failure, not a hung test run
            code = 0 if check() else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _held_by_a_thread(lock) -> tuple[threading.Event, threading.Thread]:
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(30)

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    assert held.wait(10)
    return release, t


def test_a_child_forked_while_a_thread_holds_the_lock_can_take_it():
    lock = ForkSafeLock()
    plain = threading.Lock()
    release, t = _held_by_a_thread(lock)
    release_plain, t_plain = _held_by_a_thread(plain)
    try:
        assert _fork_and(lambda: lock.acquire(timeout=5)) == 0
        # What it replaces: a plain lock stays held in the child.
        assert _fork_and(lambda: plain.acquire(timeout=0.5)) == 1
        assert lock.locked()  # the parent's is untouched
    finally:
        release.set()
        release_plain.set()
        t.join(10)
        t_plain.join(10)
    assert not lock.locked()


def test_counters_count_in_a_child_forked_while_a_thread_was_counting(tmp_path):
    counters = SharedCounters(["items"], directory=tmp_path)
    try:
        counters.add("items")
        release, t = _held_by_a_thread(counters._thread_lock)  # a fetch thread inside add()
        try:

            def child_counts() -> bool:
                counters.add("items", 5)
                return True

            assert _fork_and(child_counts) == 0
        finally:
            release.set()
            t.join(10)
        assert counters.snapshot()["items"] == 6
    finally:
        counters.close()

"""coordl.shutdown.stop_workers: a worker's death that torch reports while coordl stops the workers is logged,
and the stop completed; any other error still raises. coordl.shutdown.worker_death: a death in each form
``next()`` raises it."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from coordl.shutdown import is_worker_death, stop_workers, worker_death


class _Joined:
    def __init__(self, alive: bool) -> None:
        self.alive, self.joined, self.killed = alive, 0, False

    def join(self, timeout: float | None = None) -> None:
        self.joined += 1

    def is_alive(self) -> bool:
        return self.alive and not self.killed

    def kill(self) -> None:
        self.killed = True


class _Queue:
    def __init__(self) -> None:
        self.closed = False

    def cancel_join_thread(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class _Event:
    def __init__(self) -> None:
        self.flag = False

    def set(self) -> None:
        self.flag = True


class _TorchIter:
    """Stands for torch's multi-process iterator whose stop is cut short by the SIGCHLD handler's report."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self._workers = [_Joined(alive=False), _Joined(alive=True)]
        self._index_queues = [_Queue(), _Queue()]
        self._workers_done_event = _Event()

    def _shutdown_workers(self) -> None:
        raise self.error


def test_a_death_reported_during_the_stop_is_logged_and_the_stop_finished(caplog: Any) -> None:
    it = _TorchIter(RuntimeError("DataLoader worker (pid 5811) is killed by signal: Aborted. "))
    with caplog.at_level(logging.WARNING, logger="coordl"):
        stop_workers(it)
    assert "pid 5811" in caplog.text and "the stop went on" in caplog.text
    assert it._workers_done_event.flag
    assert (
        all(w.joined for w in it._workers) and it._workers[1].killed
    )  # the one still running: killed, reaped
    assert all(q.closed for q in it._index_queues)


def test_any_other_error_of_the_stop_raises() -> None:
    with pytest.raises(RuntimeError, match="something else"):
        stop_workers(_TorchIter(RuntimeError("something else")))


def test_an_iterator_without_workers_is_left_alone() -> None:
    stop_workers(None)
    stop_workers(iter([1, 2]))


@pytest.mark.parametrize(
    ("message", "death"),
    [
        ("DataLoader worker (pid 12) is killed by signal: Aborted.", True),
        ("DataLoader worker (pid(s) 12, 13) exited unexpectedly", True),
        ("DataLoader timed out after 5 seconds", False),
    ],
)
def test_what_counts_as_a_worker_death(message: str, death: bool) -> None:
    assert is_worker_death(RuntimeError(message)) is death


class _Dying:
    """A worker killed by SIGKILL: its socket is reset ``seen_after`` liveness checks before its exit is seen
    (the kernel closes a killed process's files before its parent can wait for it)."""

    def __init__(self, pid: int, seen_after: int | None) -> None:
        self.pid, self.seen_after, self.checks = pid, seen_after, 0

    def is_alive(self) -> bool:
        self.checks += 1
        return self.seen_after is None or self.checks <= self.seen_after


class _Workers:
    def __init__(self, *workers: _Dying) -> None:
        self._workers = list(workers)


@pytest.mark.parametrize("reset", [ConnectionResetError(104, "Connection reset by peer"), EOFError()])
def test_a_reset_before_the_exit_is_seen_is_a_death_in_torchs_words(reset: Exception) -> None:
    it = _Workers(_Dying(7001, seen_after=None), _Dying(7002, seen_after=3))
    death = worker_death(reset, it)
    assert death is not None and is_worker_death(death)
    assert "DataLoader worker (pid(s) 7002) exited unexpectedly" in str(death)
    assert it._workers[1].checks > 3  # it waited for the exit rather than giving up at the first look


def test_a_reset_with_every_worker_alive_is_no_death() -> None:
    it = _Workers(_Dying(7001, seen_after=None))
    assert worker_death(ConnectionResetError(104, "Connection reset by peer"), it) is None
    assert worker_death(EOFError(), object()) is None  # no workers: the single-process loader


def test_torchs_own_report_is_the_death_and_other_errors_are_not() -> None:
    report = RuntimeError("DataLoader worker (pid 12) is killed by signal: Killed. ")
    assert worker_death(report, _Workers()) is report
    assert worker_death(RuntimeError("DataLoader timed out after 5 seconds"), _Workers()) is None
    assert worker_death(ValueError("a bad item"), _Workers(_Dying(1, seen_after=0))) is None

"""coordl.shutdown.stop_workers: a worker's death that torch reports while coordl stops the workers is logged,
and the stop completed; any other error still raises."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from coordl.shutdown import is_worker_death, stop_workers


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

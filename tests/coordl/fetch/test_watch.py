"""The worker table (each worker's pid and item), and ``translate_torch_error`` when torch's SIGCHLD handler
reports the death inside coordl's own wait."""

from __future__ import annotations

import os

import pytest

from coordl.errors import WorkerDiedError
from coordl.fetch.watch import translate_torch_error


class _Worker:
    """A worker process as torch's iterator lists it; asking whether it lives runs the signal handler."""

    pid, exitcode = 4321, -9

    def is_alive(self) -> bool:
        # what torch's SIGCHLD handler raises in the main thread, wherever it is at that moment
        raise RuntimeError("DataLoader worker (pid 4321) is killed by signal: Killed. ")


class _Iterator:
    _workers = [_Worker()]


@pytest.mark.parametrize("queue_error", [EOFError(), ConnectionResetError(104, "Connection reset by peer")])
def test_a_death_reported_during_the_wait_becomes_worker_died_error(queue_error: Exception) -> None:
    out = translate_torch_error(queue_error, _Iterator(), None, None)
    assert isinstance(out, WorkerDiedError)
    assert str(out).startswith("DataLoader worker (pid 4321) is killed by signal: Killed")
    assert "worker pid 4321 was killed by signal SIGKILL" in str(out)


def test_another_runtime_error_in_the_wait_is_not_swallowed() -> None:
    class Broken(_Worker):
        def is_alive(self) -> bool:
            raise RuntimeError("something else")

    class It:
        _workers = [Broken()]

    with pytest.raises(RuntimeError, match="something else"):
        translate_torch_error(EOFError(), It(), None, None)


def test_a_forked_worker_records_its_own_pid_and_item(tmp_path) -> None:
    """``on_item`` keeps no per-call getpid: a fork hook gives a forked worker its own pid."""
    import multiprocessing as mp

    from coordl.fetch.watch import WorkerWatch

    watch = WorkerWatch(2, directory=tmp_path)
    watch.on_item(1, 3)  # the parent's pid in row 1
    child = mp.get_context("fork").Process(target=watch.on_item, args=(0, 17))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert watch.item_of(child.pid) == 17 and watch.item_of(os.getpid()) == 3
    watch.idle(0)
    assert watch.item_of(child.pid) is None
    watch.close()

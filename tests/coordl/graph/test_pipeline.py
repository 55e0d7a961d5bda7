"""The pipeline makes batches ahead of the caller, never more than pipeline_depth ahead."""

from __future__ import annotations

import time

import pytest

from coordl.graph.loader import NeighborLoader


def _made(loader) -> int:
    return loader.stats()["batches"]


@pytest.mark.parametrize("workers,depth", [(0, 3), (2, 4)])
def test_loads_ahead_up_to_depth(rmat, workers, depth):
    with NeighborLoader(
        rmat, rmat.train_idx, [3, 3], batch_size=16, num_workers=workers, pipeline_depth=depth, seed=0
    ) as loader:
        assert len(loader) > depth + 2
        it = iter(loader)
        next(it)  # the caller holds batch 0 and computes for a while
        deadline = time.monotonic() + 60
        while _made(loader) < 1 + depth and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _made(loader) == 1 + depth  # made ahead while the caller was busy
        time.sleep(0.3)
        assert _made(loader) == 1 + depth  # and not one more until the caller takes a batch
        del it


def test_unpipelined_makes_nothing_ahead(rmat):
    with NeighborLoader(rmat, rmat.train_idx, [3], batch_size=16, pipeline_depth=0, seed=0) as loader:
        it = iter(loader)
        next(it)
        time.sleep(0.1)
        assert _made(loader) == 1


def test_error_in_pipeline_thread_reaches_the_caller(rmat):
    with NeighborLoader(rmat, rmat.train_idx, [3], batch_size=16, pipeline_depth=2, seed=0) as loader:
        loader.maker.fanouts = ["bad"]  # sampling raises inside the thread
        with pytest.raises(ValueError):
            next(iter(loader))


def test_closed_loader_refuses_to_iterate(rmat):
    loader = NeighborLoader(rmat, rmat.train_idx, [3], batch_size=16, seed=0)
    loader.close()
    loader.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        iter(loader)


class _ResetByADeadWorker:
    """torch's iterator when a worker is SIGKILLed while its batch is unpickled: the data queue is reset
    and torch's own look at the workers (before the exit can be seen) re-raised the bare reset."""

    class _Worker:
        pid, exitcode = 6543, -9

        def is_alive(self) -> bool:
            return False

    _workers = [_Worker()]

    def __iter__(self):
        return self

    def __next__(self):
        raise ConnectionResetError(104, "Connection reset by peer")


def test_a_worker_killed_while_its_batch_is_read_is_a_worker_died_error(rmat):
    from coordl.errors import WorkerDiedError

    with NeighborLoader(rmat, rmat.train_idx, [3], batch_size=16, num_workers=1, seed=0) as loader:
        loader._torch = _ResetByADeadWorker()  # type: ignore[assignment]
        with pytest.raises(WorkerDiedError, match=r"died in epoch 0: DataLoader worker \(pid\(s\) 6543\)"):
            next(iter(loader))

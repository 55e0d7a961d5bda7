"""A spawned worker told to stop exits cleanly, even while its last batch is still being sent.

torch's worker puts each batch on its data queue, whose feeder thread pickles it, sharing the batch's
tensors into shared memory in torch's C++ code. At shutdown torch cancels the join of that thread, and a
spawned child then finalizes its interpreter (``sys.exit``): a daemon thread that asks for the GIL after
that point is ended with ``pthread_exit``, and unwinding out of torch's C++ code aborts the process
("terminate called without an active exception"). The main process, still joining its workers, then
raised torch's "DataLoader worker (pid N) is killed by signal: Aborted" (issue 63: a resumed loader's
persistent spawn workers, once in a CI run). Here the worker's last batch is a large tensor, so the
feeder is inside that C++ copy for tens of milliseconds when the shutdown reaches the worker: with
torch's own spawn context the worker aborts in most tries; coordl's spawned workers end as forked ones do.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest
import torch

import coordl

_BIG_BYTES = 192 * 2**20  # sharing this takes the feeder ~50-200 ms, far longer than the worker's exit


class BigLastItem(torch.utils.data.Dataset):
    """Item 0 is small; item 1 is a large tensor, and a marker file says that it is being returned."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == 0:
            return torch.zeros(1)
        big = torch.zeros(_BIG_BYTES // 4)
        Path(self.marker).write_text(str(index))
        return big


def _stop_while_sending(loader: torch.utils.data.DataLoader, marker: Path) -> list[int | None]:
    """Take item 0 (torch then sends item 1's index), wait until the worker returns item 1, stop the
    workers at once; the workers' exit codes."""
    it = iter(loader)
    assert next(it).numel() == 1
    it = getattr(loader, "_torch", loader)._iterator  # (coordl's: the torch iterator under its own)
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert time.monotonic() < deadline, "the worker never made item 1"
        time.sleep(0.002)
    workers = list(it._workers)
    it._shutdown_workers()  # as a resumed loader does with its persistent workers, and close()
    for w in workers:
        w.join(30)
    return [w.exitcode for w in workers]


def _loader(cls: type, marker: Path, context: object) -> torch.utils.data.DataLoader:
    return cls(
        BigLastItem(str(marker)), batch_size=None, num_workers=1, prefetch_factor=1,
        persistent_workers=True, multiprocessing_context=context,
    )  # fmt: skip


@pytest.mark.timeout(300)
def test_a_spawned_worker_stopped_while_its_batch_is_sent_exits_cleanly(tmp_path: Path) -> None:
    for attempt in range(3):
        marker = tmp_path / f"coordl-{attempt}"
        loader = _loader(coordl.DataLoader, marker, "spawn")
        try:
            # torch's SIGCHLD handler would raise "killed by signal: Aborted" in here
            assert _stop_while_sending(loader, marker) == [0]
        finally:
            loader.close()


def _aborts_with(context: object, tmp_path: Path, tries: int) -> int:
    aborted = 0
    for attempt in range(tries):
        marker = tmp_path / f"torch-{attempt}"
        try:
            codes = _stop_while_sending(_loader(torch.utils.data.DataLoader, marker, context), marker)
        except RuntimeError as error:  # torch's SIGCHLD handler, during the join
            assert "killed by signal: Aborted" in str(error)
            codes = [-6]
        aborted += codes != [0]
    return aborted


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_cause_torch_spawned_workers_abort_so_and_coordls_do_not(tmp_path: Path) -> None:
    """The cause, on torch's own loader: with plain ``spawn`` the stop aborts the worker in some of the
    tries (3 of 4 on the 2-core hosts seen; how many depends on the host's timing, so it is printed, not
    asserted); with coordl's spawn context (what coordl.DataLoader gives torch) never.

    torch's own context is tried by hand only (``COORDL_STRESS_RUNS=N``, run with ``-s`` to see the count):
    it asserts nothing, and CI's ``-q`` run never showed its line (4 spawned workers, ~20 s of CI's parallel
    phase)."""
    from coordl.workers.start import _FLAGGED

    runs = os.environ.get("COORDL_STRESS_RUNS")
    tries = int(runs or 4)
    assert _aborts_with(_FLAGGED[multiprocessing.context.SpawnContext], tmp_path, tries) == 0
    if runs:
        print(f"torch's own spawn context: {_aborts_with('spawn', tmp_path, tries)} aborts in {tries} tries")


def _abort_at_exit(worker_id: int) -> None:
    atexit.register(os.abort)  # a worker that dies on its way out, after its last batch


class Numbers(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> int:
        return index


@pytest.mark.timeout(300)
def test_a_worker_dying_as_a_resumed_loader_stops_it_is_no_error_of_the_pass() -> None:
    """Persistent spawn workers that abort as they exit: loading a state stops them (and close() stops
    the next ones); each death is reported by torch meanwhile, and the resumed pass still gives every
    batch after the state, as the uninterrupted run did."""
    loader = coordl.DataLoader(
        Numbers(), batch_size=2, num_workers=2, persistent_workers=True, multiprocessing_context="spawn",
        worker_init_fn=_abort_at_exit,
    )  # fmt: skip
    try:
        it = iter(loader)
        first = [next(it).tolist() for _ in range(3)]
        state = loader.state_dict()
        rest = [b.tolist() for b in it]
        workers = list(loader._torch._iterator._workers)
        loader.load_state_dict(state)
        assert [b.tolist() for b in loader] == rest  # the old workers aborted while they were stopped
        assert all(w.exitcode == -signal.SIGABRT for w in workers)  # (they did die so)
        # (whether torch's SIGCHLD handler reports a death during the stop depends on whether it runs before
        # the join reaps the worker: tests/coordl/test_shutdown.py holds that case exactly)
        assert first + rest == [[i, i + 1] for i in range(0, 16, 2)]
    finally:
        loader.close()  # the resumed pass's workers abort too, as close() stops them

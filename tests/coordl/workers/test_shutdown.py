"""A killed worker never leaves torch's shutdown event locked: the loader still closes and starts again.

torch's workers check ``_workers_done_event.is_set()`` between batches, and ``multiprocessing.Event``
takes a lock to do so. A worker killed in that instant (``kill -9``, the OOM killer) left the lock held,
and the main process then waited forever: in torch's ``_try_get_data`` (which reads the event when it
finds the dead worker) or in ``_shutdown_workers`` (``close()``, the next epoch). CI hung so on
``test_batch_ring.py``'s killed-worker test. coordl gives torch a lock-free event (``shmem.flag``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest

import coordl
from coordl.errors import WorkerDiedError
from shmem.flag import SharedFlag
from tests.coordl.ldr_sources import PidSource


def _hold_and_die(lock, held) -> None:
    lock.acquire()
    held.set()
    os.kill(os.getpid(), signal.SIGKILL)


def test_what_a_killed_process_leaves_of_a_multiprocessing_event_and_of_a_shared_flag() -> None:
    ctx = mp.get_context("fork")
    event, flag, held = ctx.Event(), SharedFlag(ctx), ctx.Event()
    p = ctx.Process(target=_hold_and_die, args=(event._cond._lock, held))  # killed inside is_set()
    p.start()
    assert held.wait(30)
    p.join(30)
    assert not event._cond._lock.acquire(timeout=0.2)  # the Event: locked for good, set() would hang
    flag.set()  # the flag has nothing to hold
    assert flag.is_set() and flag.wait(0)
    flag.clear()
    assert not flag.wait(0.02)


def _child_sees(flag, seen) -> None:
    seen.value = int(flag.wait(10))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_shared_flag_crosses_into_children(method: str) -> None:
    ctx = mp.get_context(method)
    flag, seen = SharedFlag(ctx), ctx.RawValue("b", 0)
    p = ctx.Process(target=_child_sees, args=(flag, seen))
    p.start()
    flag.set()
    p.join(60)
    assert p.exitcode == 0 and seen.value == 1


@pytest.mark.timeout(180)
@pytest.mark.parametrize("context", [None, "spawn", "forkserver"])
def test_a_killed_worker_then_the_next_epoch_and_close(context: str | None) -> None:
    dl = coordl.DataLoader(PidSource(120), batch_size=4, num_workers=2, persistent_workers=True,
                           multiprocessing_context=context)  # fmt: skip
    it = iter(dl)
    first = next(it)
    torch_iter = dl._torch._iterator
    assert isinstance(torch_iter._workers_done_event, SharedFlag)
    os.kill(int(first[0, 1]), signal.SIGKILL)
    with pytest.raises(WorkerDiedError):
        for _ in it:
            pass
    t0 = time.monotonic()
    assert sum(len(b) for b in dl) == 120  # fresh workers
    dl.close()
    assert time.monotonic() - t0 < 120
    mine = dl.multiprocessing_context  # what the user set is what they read back
    assert mine is None if context is None else type(mine) is type(mp.get_context(context))

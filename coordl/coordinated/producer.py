"""The producer process of coordinated prep: it claims the group's next batch, preps it, and writes it.

Each job of a group (:class:`coordl.coordinated.job.GroupMember`) starts ``num_workers`` (at least one)
of these processes. A producer claims a batch given back by a dead producer (REDO), or else the next
unclaimed one once its slot is free, runs the job's fetch+prep+collate (:class:`BatchMaker`) on that
batch's indices, encodes it into its slot of the ring and rings the other members. It exits when its
job stops it, when its job dies, or when the group has no members left.

Kept apart from the job side so that what runs in the forked or spawned process is read in one
place; ``coordl.coordinated.job`` starts :func:`producer_main`.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import signal
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from coordl.coordinated import batchcodec
from coordl.coordinated import control as gc
from shmem.segment import start_ticks

__all__ = ["BatchMaker", "epoch_order", "producer_main"]


def epoch_order(num_items: int, seed: int, shuffle: bool, epoch: int) -> torch.Tensor:
    """The items of the group's epoch ``epoch`` in order: every job and producer agrees on it."""
    if not shuffle:
        return torch.arange(num_items)
    return torch.randperm(num_items, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))


def _epoch_batches(g: int, hdr: np.ndarray, cache: dict[int, torch.Tensor]) -> list[int]:
    nbatches, n, bs = int(hdr[gc.H_BATCHES]), int(hdr[gc.H_ITEMS]), int(hdr[gc.H_BS])
    epoch, b = divmod(g, nbatches)
    if epoch not in cache:
        cache.clear()
        cache[epoch] = epoch_order(n, int(hdr[gc.H_SEED]), bool(hdr[gc.H_SHUFFLE]), epoch)
    return cache[epoch][b * bs : (b + 1) * bs].tolist()


def _set_parent_death_signal() -> None:
    # A producer must not outlive its job, even when the job is killed with SIGKILL.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def producer_main(
    base: str, slots: int, make_batch: Callable[[list[int]], Any], member_pid: int, stop: Any
) -> None:
    """Claim, prep and publish the group's batches until ``stop`` is set, the job dies or the group empties."""
    _set_parent_death_signal()
    # One core per producer, as torch does in its loader workers. It also keeps the producer off the
    # OpenMP thread pool it inherited from the job: a pool used before the fork (the probe batch that
    # sizes the slots runs a large resize on several threads) hangs a forked child's first parallel op.
    torch.set_num_threads(1)
    ctl = gc.Control(base, slots)
    data_fd = os.open(base + ".data", os.O_RDWR)
    slot_bytes = int(ctl.hdr[gc.H_SLOTBYTES])
    data = mmap.mmap(data_fd, slots * slot_bytes)
    me, start = os.getpid(), start_ticks(os.getpid())
    with ctl.locked():
        row = next(r for r in range(gc.PRODUCERS) if ctl.producers[r, 0] == 0)
        ctl.producers[row] = (me, start, member_pid)
    perm_cache: dict[int, torch.Tensor] = {}
    try:
        while not stop.is_set() and os.getppid() == member_pid:
            g = None
            # The job's exit terminates its producers (SIGTERM): hold that signal while a claim is
            # half written, or batch g_next is counted as taken while no slot says who has it, and
            # every job waits for it forever.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            try:
                with ctl.locked():
                    if not ctl.members[:, 0].any():
                        return
                    redo = np.nonzero(ctl.slots[:, 1] == gc.REDO)[0]
                    if len(redo):
                        s = int(redo[0])
                        g = int(ctl.slots[s, 0])
                        ctl.claim(s, g, me, start)
                    else:
                        g_next = int(ctl.hdr[gc.H_NEXT])
                        s = g_next % slots
                        state, held = int(ctl.slots[s, 1]), int(ctl.slots[s, 0])
                        if state == gc.EMPTY or (state == gc.READY and ctl.consumed_by_all(held)):
                            g = g_next
                            # The claim first: a SIGKILL between the two writes leaves a claim by a
                            # dead producer, which sweep() gives back (REDO), never a lost batch.
                            ctl.claim(s, g, me, start)
                            ctl.hdr[gc.H_NEXT] = g_next + 1
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            if g is None:
                ctl.wait_bell(gc.SWEEP_S)
                with ctl.locked():
                    ctl.sweep()
                continue
            batch = make_batch(_epoch_batches(g, ctl.hdr, perm_cache))
            view = memoryview(data)[s * slot_bytes : (s + 1) * slot_bytes]
            nbytes = batchcodec.encode_into(batch, view)
            view.release()
            with ctl.locked():
                ctl.slots[s, 4] = nbytes
                ctl.slots[s, 1] = gc.READY
            ctl.ring_all()
    finally:
        with ctl.locked():
            ctl.producers[row] = 0
        data.close()
        os.close(data_fd)
        ctl.close()


class BatchMaker:
    """``indices -> collated batch`` for producers: the loader's fetch+prep pipeline, then collate."""

    def __init__(self, dataset: Any, collate_fn: Callable[[list[Any]], Any]) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn

    def __call__(self, indices: list[int]) -> Any:
        getitems = getattr(self.dataset, "__getitems__", None)
        samples = getitems(indices) if callable(getitems) else [self.dataset[i] for i in indices]
        return self.collate_fn(samples)

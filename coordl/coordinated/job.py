"""Coordinated prep: K jobs on one server that train on the same data fetch and prep each batch once.

Hyper-parameter search runs K jobs over the same dataset; independently each fetches and preps every
item, K times the CPU. With ``coordl.DataLoader(..., coordinate="name")`` the jobs of group ``name``
share one batch sequence:

* The sequence is global: batch ``g`` is batch ``g % B`` of group epoch ``g // B`` (B batches per
  epoch), its indices drawn from a permutation seeded by (seed, epoch), so every job agrees on it.
* Producer processes (each job's workers) *claim* the next unclaimed batch, prep it, and write it into
  staging slot ``g % S`` of a shared-memory ring of S slots. Claiming is dynamic, so a fast job preps
  more and a dead job's claimed batches are redone by the others.
* Every job consumes every batch in order. A job's *cursor* is the next batch it will read; slot
  ``g % S`` can be reused once every live member that needs batch ``g`` has moved past it. The ring
  bounds memory: a fast job waits instead of memory growing.
* Nobody busy-waits: each process binds an abstract Unix datagram socket (a doorbell); whoever
  publishes a batch or advances a cursor rings the others. Waits wake at least every
  half a second to sweep dead members and producers (pid + start time), and give up after the group
  timeout with :class:`~coordl.errors.CoordlTimeoutError`.
* A late job joins at the next epoch boundary that no producer has started.

The control block and the ring live in ``<dir>/coordl-grp-<digest>.{ctl,data}``; a lock file
``.lock`` serialises changes to the control block. The last member to leave removes all three; if every
member died, the next job to join re-initialises the group, and any job that joins a group removes the
files of other groups in the directory whose processes all died.

This module is the job side; joining the group is :mod:`coordl.coordinated.group`, the producer process
:mod:`coordl.coordinated.producer` and the control block :mod:`coordl.coordinated.control`.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import logging
import mmap
import multiprocessing as mp
import os
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from coordl.coordinated import batchcodec
from coordl.coordinated import control as gc
from coordl.coordinated.group import Group, join
from coordl.coordinated.producer import epoch_order, producer_main
from coordl.errors import CoordlError, CoordlTimeoutError
from shmem.flag import SharedFlag

__all__ = ["Group", "GroupMember"]

log = logging.getLogger("coordl")


class GroupMember:
    """One job's membership in a coordination group: its producers and its view of the batches.

    Args:
        group: the group's options.
        num_items: length of the dataset.
        batch_size, drop_last: as in DataLoader; every job of the group must agree.
        shuffle: whether each group epoch uses a fresh permutation.
        make_batch: ``indices -> collated batch`` (fetch + prep + collate), run in producer processes.
        num_producers: producer processes this job contributes (its ``num_workers``, at least 1).
        mp_context: multiprocessing context for the producers.
    """

    def __init__(
        self,
        group: Group,
        *,
        num_items: int,
        batch_size: int,
        drop_last: bool,
        shuffle: bool,
        make_batch: Callable[[list[int]], Any],
        num_producers: int = 1,
        mp_context: Any = None,
    ) -> None:
        if num_items <= 0:
            raise ValueError("coordinate: the dataset is empty")
        self.group = group
        digest = hashlib.sha1(group.name.encode()).hexdigest()[:16]
        self.base = os.path.join(group.directory, f"coordl-grp-{digest}")
        self.batches_per_epoch = num_items // batch_size if drop_last else -(-num_items // batch_size)
        if self.batches_per_epoch == 0:
            raise ValueError(f"coordinate: batch_size={batch_size} with drop_last leaves no batch")
        params = {"num_items": num_items, "batch_size": batch_size, "seed": group.seed,
                  "shuffle": int(shuffle), "drop_last": int(drop_last)}  # fmt: skip
        self._params = params
        self._make_batch = make_batch
        self._resume_at: tuple[int, int] | None = None  # (group epoch, batches done) of a saved state
        self._epoch_done = 0  # batches of the running epoch handed out (for state_dict)
        self._epoch_index = 0  # the group epoch of the running (or last) pass
        self._ctl: gc.Control | None = None
        self._data: mmap.mmap | None = None
        self._stop: Any = None
        self._producers: list[Any] = []
        self._pid = os.getpid()
        os.makedirs(group.directory, exist_ok=True)
        gc.reclaim_dead_groups(group.directory)  # leftovers of jobs that were all killed
        self._ctl, self._row = join(group, self.base, params, self.batches_per_epoch, make_batch)
        # Leave at exit while the interpreter still works: __del__ during shutdown fails (numpy can
        # no longer import), which left the group's files behind.
        self._exit_hook = functools.partial(_close_if_alive, weakref.ref(self))
        atexit.register(self._exit_hook)
        try:
            self._start(group, make_batch, num_producers, mp_context)
        except BaseException:
            self.close()  # leave at once: the others must not wait for a job that never started
            raise

    def _start(
        self, group: Group, make_batch: Callable[[list[int]], Any], num_producers: int, mp_context: Any
    ) -> None:
        """Map the ring and start this job's producers (after joining)."""
        assert self._ctl is not None  # joined just before, in __init__
        slot_bytes = int(self._ctl.hdr[gc.H_SLOTBYTES])
        self._data_fd = os.open(self.base + ".data", os.O_RDONLY)
        self._data = mmap.mmap(self._data_fd, group.slots * slot_bytes, prot=mmap.PROT_READ)
        self._slot_bytes = slot_bytes
        ctx = mp_context or mp.get_context()
        # A lock-free flag, not an Event: a producer killed inside Event.is_set() (the SIGTERM that
        # multiprocessing sends daemons at exit) leaves its lock held and the job's close() hanging.
        self._stop = SharedFlag(ctx)
        for i in range(max(1, num_producers)):
            p = ctx.Process(target=producer_main, daemon=True, name=f"coordl-producer-{i}",
                            args=(self.base, group.slots, make_batch, os.getpid(), self._stop))  # fmt: skip
            self._producers.append(p)
            p.start()

    def __len__(self) -> int:
        return self.batches_per_epoch

    def epoch(self) -> Iterator[Any]:
        """Yield the batches of this job's next group epoch, in order."""
        ctl, nb = self._ctl, self.batches_per_epoch
        if ctl is None:
            raise CoordlError(f"coordinate group {self.group.name!r}: this job is closed")
        cursor = int(ctl.members[self._row, 3])
        resume, self._resume_at = self._resume_at, None
        if resume is not None and resume[0] != cursor // nb:
            yield from self._own_batches(*resume, group_epoch=cursor // nb)
            return
        self._epoch_index = cursor // nb
        start = cursor
        if resume is not None:  # the group is at the saved epoch: rejoin at the saved position
            start = cursor // nb * nb + resume[1]
            self._advance(start)
        end = cursor // nb * nb + nb
        self._epoch_done = start - cursor // nb * nb
        try:
            for g in range(start, end):
                batch = self._read(g)
                self._epoch_done += 1  # counted as handed out when yielded (state_dict may come next)
                yield batch
                self._advance(g + 1)
        finally:
            # A job that stops early (break, exception) must not hold the others back.
            if self._ctl is not None and int(self._ctl.members[self._row, 3]) < end:
                self._advance(end)

    # -- resuming a saved position -------------------------------------------------------------------

    def position(self) -> tuple[int, int]:
        """``(group epoch, batches of it handed out)`` of the pass running or last run."""
        return self._epoch_index, self._epoch_done

    def resume_at(self, group_epoch: int, batches_done: int) -> None:
        """The next :meth:`epoch` continues the saved position: with the group if it is at that epoch,
        else (the group moved on, or was started afresh) with this job's own batches for the rest of
        that epoch; the pass after it is the group's next."""
        if not 0 <= batches_done <= self.batches_per_epoch:
            raise ValueError(f"batches_done={batches_done} outside 0..{self.batches_per_epoch}")
        if batches_done == self.batches_per_epoch:  # saved at the epoch's end: the next epoch, whole
            group_epoch, batches_done = group_epoch + 1, 0
        self._resume_at = (int(group_epoch), int(batches_done))

    def _own_batches(self, epoch: int, done: int, *, group_epoch: int) -> Iterator[Any]:
        """The rest of group epoch ``epoch`` made by this process alone (the group is elsewhere)."""
        nb, bs = self.batches_per_epoch, int(self._params["batch_size"])
        log.warning(
            "coordl: coordinate group %r is at epoch %d, not at the saved epoch %d: this job makes the "
            "remaining %d batches of epoch %d itself, then rejoins the group",
            self.group.name, group_epoch, epoch, nb - done, epoch,
        )  # fmt: skip
        order = epoch_order(self._params["num_items"], self.group.seed, bool(self._params["shuffle"]), epoch)
        self._epoch_index, self._epoch_done = epoch, done
        for b in range(done, nb):
            batch = self._make_batch(order[b * bs : (b + 1) * bs].tolist())
            self._epoch_done += 1
            yield batch

    def _advance(self, cursor: int) -> None:
        ctl = self._ctl
        if ctl is None:  # closed while a pass was suspended
            raise CoordlError(f"coordinate group {self.group.name!r}: this job is closed")
        ctl.members[self._row, 3] = cursor
        ctl.ring_all()

    def _read(self, g: int) -> Any:
        ctl, data, s = self._ctl, self._data, g % self.group.slots
        if ctl is None or data is None:  # closed while a pass was suspended
            raise CoordlError(f"coordinate group {self.group.name!r}: this job is closed")
        deadline = time.monotonic() + self.group.timeout_s
        while True:
            n = ctl.ready_bytes(s, g)
            if n is not None:
                return batchcodec.decode(memoryview(data)[s * self._slot_bytes : s * self._slot_bytes + n])
            if not any(p.is_alive() for p in self._producers):
                codes = [p.exitcode for p in self._producers]
                raise CoordlError(
                    f"coordinate group {self.group.name!r}: this job's producers died (exit codes {codes})"
                )
            left = deadline - time.monotonic()
            if left <= 0:
                nb = self.batches_per_epoch
                raise CoordlTimeoutError(
                    f"coordinate group {self.group.name!r}: waited {self.group.timeout_s:.0f}s for batch "
                    f"{g % nb} of group epoch {g // nb} (slot {s} state {int(ctl.slots[s, 1])})"
                )
            ctl.wait_bell(min(left, gc.SWEEP_S))
            with ctl.locked():
                ctl.sweep()

    def close(self) -> None:
        """Leave the group; the last member removes the shared files (lock file included)."""
        if self._ctl is None or os.getpid() != self._pid:
            return  # a forked child's copy is not a member
        atexit.unregister(self._exit_hook)
        if self._stop is not None:
            self._stop.set()
        ctl = self._ctl
        with ctl.locked():
            ctl.members[self._row] = 0
            last = not ctl.members[:, 0].any()
        ctl.ring_all()
        for p in self._producers:
            if p.pid is None:
                continue  # its start failed
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        with ctl.locked():
            ctl.sweep()
            # is_current: if the group was removed and made afresh meanwhile, those paths are not ours.
            if last and not ctl.members[:, 0].any() and ctl.is_current():
                gc.remove_group_files(self.base)
        if self._data is not None:
            self._data.close()
            os.close(self._data_fd)
        ctl.close()
        self._ctl = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _close_if_alive(ref: weakref.ref[GroupMember]) -> None:
    member = ref()
    if member is not None:
        member.close()

"""A coordination group: its options (:class:`Group`) and joining its control block.

A job joins under the group's lock (:func:`coordl.coordinated.control.lock_group`): it takes the live
control block if the group has one (its parameters must match this job's), else creates the control
block and reserves the ring afresh (the first job, or every member died), then takes a free row of the
member table starting at the first batch it can see whole epochs from. What the group is and how its
jobs share batches: :mod:`coordl.coordinated.job`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from coordl.coordinated import batchcodec
from coordl.coordinated import control as gc
from coordl.errors import CoordlError
from shmem.segment import DEFAULT_DIR, start_ticks

__all__ = ["Group", "join"]


@dataclass(frozen=True)
class Group:
    """Options of a coordination group (``coordinate="name"`` is ``Group("name")``).

    Args:
        name: jobs that pass the same name (and the same dataset, batch size, shuffle, drop_last and
            seed) share batches.
        slots: staging slots in the ring; memory used is ``slots * slot_bytes``.
        slot_bytes: bytes per slot; default: the encoded size of a batch made of item 0, plus 5%.
        timeout_s: the longest any wait (for a batch, for a free slot) may last before an error.
        seed: the group's shuffle seed (all jobs must agree).
        directory: where the shared files live.
    """

    name: str
    slots: int = 8
    slot_bytes: int | None = None
    timeout_s: float = 300.0
    seed: int = 0
    directory: str = DEFAULT_DIR


def join(
    g: Group,
    base: str,
    params: dict[str, int],
    batches_per_epoch: int,
    make_batch: Callable[[list[int]], Any],
) -> tuple[gc.Control, int]:
    """Join group ``g`` (its files at ``base``), creating it when it has no live member: ``(its control
    block, this job's row in the member table)``. ``params`` must match the group's (num_items,
    batch_size, seed, shuffle, drop_last); ``make_batch`` makes a probe batch to size the slots."""
    lock_fd = gc.lock_group(base)
    assert lock_fd is not None  # a blocking lock always returns its fd
    try:
        ctl = _open_existing(g, base)
        if ctl is None:
            try:
                ctl = _create(g, base, params, batches_per_epoch, make_batch)
            except BaseException:
                gc.remove_group_files(base)  # no half-made group outlives a failed start
                raise
        for name, field in gc.PARAMS.items():
            theirs = int(ctl.hdr[field])
            if theirs != params[name]:
                ctl.close()
                raise ValueError(
                    f"coordinate group {g.name!r}: this job has {name}={params[name]} but the group "
                    f"has {name}={theirs}; all jobs of a group must agree"
                )
        free = np.nonzero(ctl.members[:, 0] == 0)[0]
        if not len(free):
            ctl.close()
            raise CoordlError(f"coordinate group {g.name!r} is full ({gc.MEMBERS} jobs)")
        first = _first_batch(ctl, batches_per_epoch, g.slots)
        row = int(free[0])
        ctl.members[row] = (os.getpid(), start_ticks(os.getpid()), first, first)
        return ctl, row
    finally:
        os.close(lock_fd)  # releases the lock


def _first_batch(ctl: gc.Control, nb: int, slots: int) -> int:
    """The first batch a joining job can see whole epochs from (called under the lock).

    The earliest epoch start whose batches produced so far are all still in the ring (jobs
    launched together share from the start, even if a producer already ran into the next
    epoch); otherwise the next epoch boundary nobody has started.
    """
    claimed = int(ctl.hdr[gc.H_NEXT])
    first = -(-claimed // nb) * nb
    start = claimed // nb * nb
    while start >= 0 and claimed - start <= slots:
        if not all(int(ctl.slots[g % slots, 0]) == g for g in range(start, claimed)):
            break
        first, start = start, start - nb
    return first


def _open_existing(g: Group, base: str) -> gc.Control | None:
    """The group's live control block (under the lock), or None to create it afresh."""
    try:
        theirs = gc.slots_for_size(os.path.getsize(base + ".ctl"))
    except FileNotFoundError:
        return None
    if theirs is None:
        return None
    ctl = gc.Control(base, theirs)
    if int(ctl.hdr[gc.H_MAGIC]) != gc.MAGIC or int(ctl.hdr[gc.H_VER]) != gc.VERSION:
        ctl.close()
        return None
    ctl.sweep()
    if ctl.all_dead():
        ctl.close()
        return None  # every member died: start the group afresh (whatever its slot count was)
    if theirs != g.slots:
        ctl.close()
        raise ValueError(f"coordinate group {g.name!r} uses a different number of slots")
    return ctl


def _create(
    g: Group,
    base: str,
    params: dict[str, int],
    batches_per_epoch: int,
    make_batch: Callable[[list[int]], Any],
) -> gc.Control:
    """A new control block and ring for group ``g`` (under the lock)."""
    slot_bytes = g.slot_bytes
    if slot_bytes is None:
        probe = make_batch([0] * params["batch_size"])
        slot_bytes = int(batchcodec.encoded_size(probe) * 1.05) + 4096
    with open(base + ".ctl", "wb") as f:
        f.truncate(gc.ctl_size(g.slots))
    with open(base + ".data", "wb") as f:
        f.truncate(g.slots * slot_bytes)
        # Reserve the ring now: a full /dev/shm must fail here, not with SIGBUS mid-epoch.
        try:
            os.posix_fallocate(f.fileno(), 0, g.slots * slot_bytes)
        except OSError as e:
            raise CoordlError(
                f"coordinate group {g.name!r}: cannot reserve {g.slots} x {slot_bytes} bytes in "
                f"{g.directory} ({e.strerror}); use fewer slots or Group(directory=...) with room"
            ) from None
    ctl = gc.Control(base, g.slots)
    hdr = ctl.hdr
    hdr[:] = 0
    hdr[gc.H_SLOTS], hdr[gc.H_SLOTBYTES], hdr[gc.H_BATCHES] = g.slots, slot_bytes, batches_per_epoch
    for name, field in gc.PARAMS.items():
        hdr[field] = params[name]
    hdr[gc.H_VER] = gc.VERSION
    hdr[gc.H_MAGIC] = gc.MAGIC  # last: a half-initialised block is never taken as valid
    return ctl

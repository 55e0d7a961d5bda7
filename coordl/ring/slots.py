"""The batch ring's slots: a worker's segment of reused batch slots and the descriptors that name them.

This module owns the segment's layout (:data:`HEADER_BYTES`, the slot states :data:`FREE` and
:data:`LENT`), :class:`WorkerRing` (a worker's segment and its slots), :class:`RingBatch` (the small
descriptor a worker sends instead of a batch) and :class:`Stacked`. The worker side that fills slots is
:mod:`coordl.ring.writer` (with :mod:`coordl.ring.stacker`); the main process's side, which maps
segments and rebuilds batches, is :mod:`coordl.ring.reader`, whose docstring gives the rules that keep
the two safe.
"""

from __future__ import annotations

import multiprocessing.util
import os
import weakref
from typing import Any

import numpy as np
import torch

from coordl.ring.layout import ALIGN, align, gather, leaf_layout
from shmem.segment import Segment, free_bytes

__all__ = [
    "FREE",
    "HEADER_BYTES",
    "LENT",
    "MAPPED_STATES",
    "PAGE_BYTES",
    "RECEIVERS",
    "RingBatch",
    "Stacked",
    "WorkerRing",
]

PAGE_BYTES = 4096
HEADER_BYTES = PAGE_BYTES  # one int32 state per slot; slots start on a page boundary
FREE, LENT = 0, 1


# -- descriptor ------------------------------------------------------------------------------------


class RingBatch:
    """What crosses torch's result queue instead of a batch: where it lies and how to rebuild it.

    The receiving process maps the segment the moment it unpickles the descriptor (see
    :data:`RECEIVERS`), not when torch hands the batch out: torch keeps batches that arrive out of
    order, and tells an iterable dataset's worker that has run out to exit, before it yields them, and
    a worker that exits unlinks a segment nobody mapped. torch's own shared-memory batches are safe for
    the same reason: their file descriptors are taken over at unpickling.
    """

    def __init__(
        self,
        path: str,
        slot: int,
        offset: int,
        nbytes: int,
        leaves: list,
        scalars: list,
        spec: tuple,
        ring: int = 0,
    ) -> None:
        self.path, self.slot, self.offset, self.nbytes = path, slot, offset, nbytes
        self.leaves = leaves  # per ring leaf: (byte offset in slot, torch dtype, batch shape)
        self.scalars = scalars  # per scalar leaf: the raw values, collated by the main process
        self.spec = spec
        self.ring = ring  # the receiving BatchRing's key in RECEIVERS
        self.pin = False
        self.stacked = False  # stacked sample by sample as they were made (Stacker), not at collate
        self.in_place = 0  # of its samples, those a transform wrote straight into the slot
        self.lost: str | None = None  # why the receiver could not map the segment, if it could not
        self._held = False  # True in the receiving process until the batch is built

    def pin_memory(self, device: Any = None) -> RingBatch:
        # torch's pin thread calls this; the main thread then copies into pinned memory.
        self.pin = True
        return self

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_held"] = False
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._held = True
        receiver = RECEIVERS.get(self.ring)
        if receiver is not None:
            try:
                receiver.receive(self)
            except Exception as e:  # noqa: BLE001 - never fail inside torch's unpickling; unwrap says why
                self.lost = f"{type(e).__name__}: {e}"

    def __del__(self) -> None:
        # Dropped unbuilt (early break, persistent workers resuming, worker error): give the slot back.
        if getattr(self, "_held", False):
            self._held = False
            try:
                _release_unbuilt(self.path, self.slot)
            except Exception:  # noqa: BLE001 - interpreter shutdown or the worker already gone
                pass


# Header views of the segments this process has mapped, so a dropped descriptor can free its slot.
# The main process's batch rings by key (``RingCollate.ring``): a descriptor unpickled here is handed to
# its ring's ``receive`` at once (:class:`coordl.ring.reader.BatchRing`).
RECEIVERS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
MAPPED_STATES: weakref.WeakValueDictionary[str, np.ndarray] = weakref.WeakValueDictionary()


def _release_unbuilt(path: str, slot: int) -> None:
    states = MAPPED_STATES.get(path)
    if states is not None:
        states[slot] = FREE
        return
    try:  # never mapped here: write the state through the file (still named: the worker is alive)
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        return
    try:
        os.pwrite(fd, np.int32(FREE).tobytes(), slot * 4)
    finally:
        os.close(fd)


# -- worker side -----------------------------------------------------------------------------------


class WorkerRing:
    """One worker's segment: ``num_slots`` slots of ``slot_bytes``, reserved as first needed."""

    def __init__(
        self,
        spec: tuple,
        slot_bytes: int,
        num_slots: int,
        directory: str,
        segment: Segment | None = None,
        receiver: int = 0,
        reader: str | None = None,
    ) -> None:
        self.spec, self.slot_bytes, self.num_slots = spec, slot_bytes, num_slots
        self.receiver = receiver  # the main process's BatchRing, as a key of RECEIVERS
        self.adopted = segment is not None
        if segment is None:
            # Named for the main process too: killed, this worker may have batches in torch's queue still
            # to be mapped; another process's reclaim must leave the segment while the main process lives.
            segment = Segment.create("ring", HEADER_BYTES + num_slots * slot_bytes, directory, reader=reader)
            # The worker exits through multiprocessing, which skips atexit: unlink there if never mapped.
            multiprocessing.util.Finalize(None, segment.unlink, exitpriority=0)
        self.segment = segment
        self.directory = directory
        self.usable = 0  # slots reserved so far
        self.capped = not self._reserve(0, HEADER_BYTES)
        self.states = self.segment.array(np.int32, 0, num_slots)
        self.next = 0

    def _reserve(self, offset: int, nbytes: int) -> bool:
        try:
            return self.segment.reserve(offset, nbytes)
        except OSError:  # e.g. ENOMEM from a memory cgroup: treat like a full /dev/shm
            return False

    def take_slot(self) -> int | None:
        """A free slot, now marked lent, or None."""
        for k in range(self.usable):
            slot = (self.next + k) % self.usable
            if self.states[slot] == FREE:
                self.states[slot] = LENT
                self.next = slot + 1
                return slot
        while not self.capped and self.usable < self.num_slots:
            # Leave room for a batch of torch's own fallback, so taking a slot never starves it.
            # (An adopted segment's slots already have their pages: reserving them takes nothing.)
            if (not self.adopted and free_bytes(self.directory) < 2 * self.slot_bytes) or not self._reserve(
                HEADER_BYTES + self.usable * self.slot_bytes, self.slot_bytes
            ):
                self.capped = True
                return None
            slot = self.usable
            self.usable += 1
            if self.states[slot] == FREE:  # an adopted slot may still hold a batch the user keeps
                self.states[slot] = LENT
                self.next = slot + 1
                return slot
        return None

    def collate(self, batch: list) -> RingBatch | None:
        rings: list[list] = []
        scalars: list[list] = []
        if not gather(self.spec, batch, rings, scalars):
            return None
        layouts, offset = [], 0
        for values in rings:
            layout = leaf_layout(values)
            if layout is None:
                return None
            layouts.append((offset, *layout))
            offset = align(offset + len(values) * layout[2], ALIGN)
        if offset == 0 or offset > self.slot_bytes:
            return None
        slot = self.take_slot()
        if slot is None:
            return None
        base = HEADER_BYTES + slot * self.slot_bytes
        n = len(batch)
        try:
            for values, (off, dtype, shape, per_sample) in zip(rings, layouts, strict=True):
                self._stack(values, base + off, n * per_sample, dtype, (n, *shape))
        except Exception:  # noqa: BLE001 - let default_collate run and raise its own error, if any
            self.states[slot] = FREE
            return None
        leaves = [(off, dtype, (n, *shape)) for off, dtype, shape, _ in layouts]
        return RingBatch(
            self.segment.path, slot, base, self.slot_bytes, leaves, scalars, self.spec, self.receiver
        )

    def _stack(self, values: list, offset: int, nbytes: int, dtype: torch.dtype, shape: tuple) -> None:
        out = self.rows(offset, nbytes, dtype, shape, values[0])
        (np.stack if type(out) is np.ndarray else torch.stack)(values, out=out)

    def rows(self, offset: int, nbytes: int, dtype: torch.dtype, shape: tuple, like: Any) -> Any:
        """Segment bytes at ``offset`` as a batch of ``shape``: a NumPy array for array leaves, else a tensor."""
        raw = self.segment.array(np.uint8, offset, nbytes)
        if type(like) is np.ndarray:
            return raw.view(like.dtype).reshape(shape)
        return torch.from_numpy(raw).view(dtype).view(shape)


class Stacked:
    """A batch the dataset already stacked into a slot; the ring's collate passes it through."""

    __slots__ = ("batch",)

    def __init__(self, batch: RingBatch) -> None:
        self.batch = batch

"""The worker side of the batch ring: a loader worker stacks each batch into a slot of its own segment.

:class:`RingCollate` runs inside each DataLoader worker: it makes the worker's segment at its first
batch (:class:`WorkerRing`), stacks batches into free slots and returns a small :class:`RingBatch`
descriptor instead of the batch. This module owns the segment's layout (:data:`HEADER_BYTES`, the slot
states :data:`FREE` and :data:`LENT`); the main process's side, which maps segments and rebuilds
batches, is :mod:`coordl.batch_ring`, whose docstring gives the rules that keep the two safe.
"""

from __future__ import annotations

import ctypes
import mmap
import multiprocessing.util
import os
import weakref
from typing import Any

import numpy as np
import torch
import torch.utils.data
from torch.utils.data.dataloader import default_collate

from coordl.batch_layout import ALIGN, align, gather, has_ring_leaf, leaf_layout, spec_of
from coordl.shm import DEFAULT_DIR, Segment, free_bytes

__all__ = [
    "FREE",
    "HEADER_BYTES",
    "LENT",
    "MAPPED_STATES",
    "RingBatch",
    "RingCollate",
    "Stacked",
    "WorkerRing",
]

_PAGE = 4096
HEADER_BYTES = _PAGE  # one int32 state per slot; slots start on a page boundary
FREE, LENT = 0, 1


# -- descriptor ------------------------------------------------------------------------------------


class RingBatch:
    """What crosses torch's result queue instead of a batch: where it lies and how to rebuild it."""

    def __init__(
        self, path: str, slot: int, offset: int, nbytes: int, leaves: list, scalars: list, spec: tuple
    ) -> None:
        self.path, self.slot, self.offset, self.nbytes = path, slot, offset, nbytes
        self.leaves = leaves  # per ring leaf: (byte offset in slot, torch dtype, batch shape)
        self.scalars = scalars  # per scalar leaf: the raw values, collated by the main process
        self.spec = spec
        self.pin = False
        self.stacked = False  # stacked sample by sample as they were made (Stacker), not at collate
        self.in_place = 0  # of its samples, those a transform wrote straight into the slot
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

    def __del__(self) -> None:
        # Dropped unbuilt (early break, persistent workers resuming, worker error): give the slot back.
        if getattr(self, "_held", False):
            self._held = False
            try:
                _release_unbuilt(self.path, self.slot)
            except Exception:  # noqa: BLE001 - interpreter shutdown or the worker already gone
                pass


# Header views of the segments this process has mapped, so a dropped descriptor can free its slot.
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
        self, spec: tuple, slot_bytes: int, num_slots: int, directory: str, segment: Segment | None = None
    ) -> None:
        self.spec, self.slot_bytes, self.num_slots = spec, slot_bytes, num_slots
        self.adopted = segment is not None
        if segment is None:
            segment = Segment.create("ring", HEADER_BYTES + num_slots * slot_bytes, directory)
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
        return RingBatch(self.segment.path, slot, base, self.slot_bytes, leaves, scalars, self.spec)

    def _stack(self, values: list, offset: int, nbytes: int, dtype: torch.dtype, shape: tuple) -> None:
        out = self.rows(offset, nbytes, dtype, shape, values[0])
        (np.stack if type(out) is np.ndarray else torch.stack)(values, out=out)

    def rows(self, offset: int, nbytes: int, dtype: torch.dtype, shape: tuple, like: Any) -> Any:
        """Segment bytes at ``offset`` as a batch of ``shape``: a NumPy array for array leaves, else a tensor."""
        raw = self.segment.array(np.uint8, offset, nbytes)
        if type(like) is np.ndarray:
            return raw.view(like.dtype).reshape(shape)
        return torch.from_numpy(raw).view(dtype).view(shape)


class RingCollate:
    """``default_collate`` that, inside a loader worker, collates into that worker's ring.

    Created in the main process and pickled or forked into the workers; each worker makes its
    segment at its first batch. Outside a worker it is exactly ``default_collate``.

    Args:
        num_slots: slots per worker (``prefetch_factor +`` :data:`coordl.batch_ring.EXTRA_SLOTS`).
        batch_size: the loader's batch size (slots hold this many samples), or None to size them by
            the first batch.
        directory: where segments live (``/dev/shm``).
    """

    def __init__(self, num_slots: int, batch_size: int | None, directory: str = DEFAULT_DIR) -> None:
        self.num_slots, self.batch_size, self.directory = int(num_slots), batch_size, directory
        # Set by the main process just before it forks an epoch's workers: worker id -> a segment of
        # the previous epoch's workers (path, fd, mapping) to stack into instead of a new one.
        self.adopt: dict[int, tuple[str, int, mmap.mmap]] = {}
        self._ring: WorkerRing | None = None
        self._disabled = False
        self._pid = -1

    def __getstate__(self) -> dict:
        return {"num_slots": self.num_slots, "batch_size": self.batch_size, "directory": self.directory}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def __call__(self, batch: list) -> Any:
        if type(batch) is Stacked:
            return batch.batch
        if not batch or torch.utils.data.get_worker_info() is None:
            return default_collate(batch)
        if self._pid != os.getpid():  # a new worker process: its own ring, made at its first batch
            self._ring, self._disabled, self._pid = None, False, os.getpid()
        if self._ring is None and not self._disabled:
            self._ring = self._make_ring(batch)
            self._disabled = self._ring is None
        out = self._ring.collate(batch) if self._ring is not None else None
        return out if out is not None else default_collate(batch)

    def stacker(self, n: int) -> Any:
        """In a worker whose ring exists: a free slot to stack ``n`` samples into as they are made.

        None before the worker's first batch (it goes through ``__call__``, which makes the ring),
        outside a worker, or when no slot is free. The dataset calls this; see
        :class:`coordl.stacker.Stacker`.
        """
        if self._pid != os.getpid() or self._ring is None:
            return None
        slot = self._ring.take_slot()
        if slot is None:
            return None
        from coordl.stacker import Stacker  # its own module; it imports this one

        return Stacker(self._ring, slot, n)

    def _adoptable(self, slot_bytes: int) -> Segment | None:
        """The segment the main process offered this worker, if its slots have this size."""
        offer = self.adopt.get(getattr(torch.utils.data.get_worker_info(), "id", None))
        self.adopt = {}
        if offer is None:
            return None
        path, fd, mapping = offer
        if len(mapping) != HEADER_BYTES + self.num_slots * slot_bytes:
            return None
        return Segment.inherited(path, fd, mapping)

    def _make_ring(self, batch: list) -> WorkerRing | None:
        spec = spec_of(batch[0])
        if spec is None or not has_ring_leaf(spec):
            return None
        rings: list[list] = []
        if not gather(spec, batch, rings, []):
            return None
        capacity = max(self.batch_size or 0, len(batch))
        slot_bytes = 0
        for values in rings:
            layout = leaf_layout(values)
            if layout is None:
                return None
            slot_bytes = align(slot_bytes + capacity * layout[2], ALIGN)
        slot_bytes = align(max(slot_bytes, 1), _PAGE)
        try:
            ring = WorkerRing(spec, slot_bytes, self.num_slots, self.directory, self._adoptable(slot_bytes))
        except OSError:
            return None
        if ring.capped:  # not even the header fits: no ring in this worker
            ring.segment.close()
            return None
        _keep_freed_heap(2 * ring.slot_bytes)
        return ring


class Stacked:
    """A batch the dataset already stacked into a slot; the ring's collate passes it through."""

    __slots__ = ("batch",)

    def __init__(self, batch: RingBatch) -> None:
        self.batch = batch


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling on 64-bit


def _keep_freed_heap(batch_bytes: int) -> None:
    """Keep up to ``batch_bytes`` (at least 64 MiB) of freed heap in this process instead of trimming.

    Setting one threshold turns off glibc's own adaptation of both, so both are set: blocks up to
    32 MiB come from the heap (not a fresh mmap each), and the heap top is trimmed only beyond.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):  # not glibc
        return
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)
    mallopt(_M_TRIM_THRESHOLD, min(max(batch_bytes, 64 << 20), 1 << 30))

"""The worker side of the batch ring: a loader worker stacks each batch into a slot of its own segment.

:class:`RingCollate` runs inside each DataLoader worker: it makes the worker's segment at its first
batch (:class:`coordl.ring.slots.WorkerRing`), stacks batches into free slots and returns a small
:class:`coordl.ring.slots.RingBatch` descriptor instead of the batch. The segment's layout is
:mod:`coordl.ring.slots`; the main process's side is :mod:`coordl.ring.reader`.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from typing import Any

import torch
import torch.utils.data
from torch.utils.data.dataloader import default_collate

from coordl.ring.layout import ALIGN, align, gather, has_ring_leaf, leaf_layout, spec_of
from coordl.ring.slots import HEADER_BYTES, PAGE_BYTES, Stacked, WorkerRing
from coordl.ring.stacker import Stacker
from shmem.segment import DEFAULT_DIR, Segment, owner_tag

__all__ = ["RingCollate"]


class RingCollate:
    """``default_collate`` that, inside a loader worker, collates into that worker's ring.

    Created in the main process and pickled or forked into the workers; each worker makes its
    segment at its first batch. Outside a worker it is exactly ``default_collate``.

    Args:
        num_slots: slots per worker (``prefetch_factor +`` :data:`coordl.ring.reader.EXTRA_SLOTS`).
        batch_size: the loader's batch size (slots hold this many samples), or None to size them by
            the first batch.
        directory: where segments live (``/dev/shm``).
    """

    def __init__(
        self,
        num_slots: int,
        batch_size: int | None,
        directory: str = DEFAULT_DIR,
        receiver: int = 0,
        reader: str | None = None,
    ) -> None:
        self.num_slots, self.batch_size, self.directory = int(num_slots), batch_size, directory
        self.receiver = receiver  # the main process's BatchRing (its key in coordl.ring.slots.RECEIVERS)
        self.reader = owner_tag() if reader is None else reader  # the main process, which maps the segments
        # Set by the main process just before it forks an epoch's workers: worker id -> a segment of
        # the previous epoch's workers (path, fd, mapping) to stack into instead of a new one.
        self.adopt: dict[int, tuple[str, int, mmap.mmap]] = {}
        self._ring: WorkerRing | None = None
        self._disabled = False
        self._pid = -1

    def __getstate__(self) -> dict:
        return {
            "num_slots": self.num_slots, "batch_size": self.batch_size, "directory": self.directory,
            "receiver": self.receiver, "reader": self.reader,
        }  # fmt: skip

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, **state)

    def __call__(self, batch: list) -> Any:
        if type(batch) is Stacked:
            return batch.batch
        if type(batch) is not list or not batch or torch.utils.data.get_worker_info() is None:
            return default_collate(batch)  # e.g. a dataset's __getitems__ that returns its own batch
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
        :class:`coordl.ring.stacker.Stacker`.
        """
        if self._pid != os.getpid() or self._ring is None:
            return None
        slot = self._ring.take_slot()
        if slot is None:
            return None

        return Stacker(self._ring, slot, n)

    def _adoptable(self, slot_bytes: int) -> Segment | None:
        """The segment the main process offered this worker, if its slots have this size."""
        worker_id = getattr(torch.utils.data.get_worker_info(), "id", None)
        offer = self.adopt.get(worker_id) if worker_id is not None else None
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
        slot_bytes = align(max(slot_bytes, 1), PAGE_BYTES)
        try:
            ring = WorkerRing(
                spec, slot_bytes, self.num_slots, self.directory, self._adoptable(slot_bytes), self.receiver,
                self.reader,
            )  # fmt: skip
        except OSError:
            return None
        if ring.capped:  # not even the header fits: no ring in this worker
            ring.segment.close()
            return None
        _keep_freed_heap(2 * ring.slot_bytes)
        return ring


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

"""Stacking a batch's samples into a ring slot as each one is made (the dataset side of the batch ring).

:class:`coordl.batch_ring.RingCollate` hands a worker a :class:`Stacker` for a free slot of its ring
(``RingCollate.stacker``); the worker's dataset adds each sample as soon as it is prepped and returns
the :class:`~coordl.batch_ring.Stacked` descriptor, which the ring's collate passes through.
"""

from __future__ import annotations

from typing import Any

import torch

from coordl.batch_layout import ALIGN, align, build, gather, leaf_layout
from coordl.batch_ring import _FREE, _HEADER_BYTES, RingBatch, Stacked, _WorkerRing

__all__ = ["Stacker"]


class Stacker:
    """Stacks one batch's samples into a slot as each is made, instead of holding them all.

    A worker that keeps its batch's samples until collate holds ``batch_size`` fresh tensors (19 MB for
    32 ImageNet crops) and then stacks them out of cold memory; copying each sample into its row while
    it is still in the CPU cache, and freeing it, lets the allocator hand the same hot memory to the
    next sample. ``add`` returns None while samples fit the slot's layout; on the first that does not
    (another shape, dtype or structure) it frees the slot and returns every sample so far as plain
    objects, and the caller goes on without the stacker (torch's collate then decides).
    """

    def __init__(self, ring: _WorkerRing, slot: int, n: int) -> None:
        self.ring, self.slot, self.n = ring, slot, n
        self.base = _HEADER_BYTES + slot * ring.slot_bytes
        self.count = 0
        self._leaves: list[tuple[int, torch.dtype, tuple, type, Any]] = []  # off, dtype, shape, type, rows
        self._scalars: list[list] = []

    def add(self, sample: Any) -> list | None:
        rings: list[list] = []
        scalars: list[list] = []
        if not gather(self.ring.spec, [sample], rings, scalars):
            return self.abort() + [sample]
        values = [v for (v,) in rings]
        if not (self._matches(values) if self._leaves else self._lay_out(values)):
            return self.abort() + [sample]
        if self.count == 0:
            self._scalars = [[] for _ in scalars]
        for (*_layout, rows), value in zip(self._leaves, values, strict=True):
            if type(value) is torch.Tensor:
                rows[self.count].copy_(value)
            else:
                rows[self.count] = value
        for acc, (value,) in zip(self._scalars, scalars, strict=True):
            acc.append(value)
        self.count += 1
        return None

    def _matches(self, values: list) -> bool:
        for (_off, dtype, shape, kind, _rows), value in zip(self._leaves, values, strict=True):
            layout = leaf_layout([value]) if type(value) is kind else None
            if layout is None or layout[0] != dtype or tuple(layout[1]) != shape:
                return False
        return True

    def _lay_out(self, values: list) -> bool:
        """Place each leaf's ``n`` rows in the slot, from the first sample's layout."""
        offset = 0
        for value in values:
            layout = leaf_layout([value])
            if layout is None or offset + self.n * layout[2] > self.ring.slot_bytes:
                self._leaves = []
                return False
            dtype, shape, per_sample = layout
            rows = self.ring.rows(self.base + offset, self.n * per_sample, dtype, (self.n, *shape), value)
            self._leaves.append((offset, dtype, tuple(shape), type(value), rows))
            offset = align(offset + self.n * per_sample, ALIGN)
        return bool(self._leaves)

    def abort(self) -> list:
        """Free the slot; the samples stacked so far, rebuilt as default_collate would see them."""
        out = []
        for k in range(self.count):
            leaves = [
                rows[k].clone() if kind is torch.Tensor else rows[k].copy()
                for *_l, kind, rows in self._leaves
            ]
            out.append(build(self.ring.spec, iter(leaves), iter([acc[k] for acc in self._scalars])))
        self._release()
        return out

    def finish(self) -> Stacked | list:
        """The batch for collate: a :class:`Stacked` descriptor, or ``[]`` if every sample was skipped."""
        if self.count == 0:
            self._release()
            return []
        leaves = [(off, dtype, (self.count, *shape)) for off, dtype, shape, _k, _r in self._leaves]
        self._leaves = []  # the row views must not outlive the batch in this process
        batch = RingBatch(
            self.ring.segment.path,
            self.slot,
            self.base,
            self.ring.slot_bytes,
            leaves,
            self._scalars,
            self.ring.spec,
        )
        batch.stacked = True
        return Stacked(batch)

    def _release(self) -> None:
        self._leaves = []
        self.ring.states[self.slot] = _FREE

"""Stacking a batch's samples into a ring slot as each one is made (the dataset side of the batch ring).

:class:`coordl.ring.writer.RingCollate` hands a worker a :class:`Stacker` for a free slot of its ring
(``RingCollate.stacker``); the worker's dataset adds each sample as soon as it is prepped and returns
the :class:`~coordl.ring.slots.Stacked` descriptor, which the ring's collate passes through.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from coordl.ring.layout import ALIGN, align, build, flatten, gather, leaf_layout
from coordl.ring.slots import FREE, HEADER_BYTES, RingBatch, Stacked, WorkerRing

__all__ = ["Stacker"]

_IN_PLACE = object()  # a leaf a transform wrote straight into its row

# Small samples are stacked a group at a time, each group as soon as it holds this many bytes: still in
# the CPU cache, and one torch.stack per leaf instead of a row view and a copy per sample (3-5 us each,
# more than a 16-byte sample's whole fetch and prep). A sample of this size or more is copied alone.
GROUP_BYTES = 64 << 10


class Stacker:
    """Stacks one batch's samples into a slot as each is made, instead of holding them all.

    A worker that keeps its batch's samples until collate holds ``batch_size`` fresh tensors (19 MB for
    32 ImageNet crops) and then stacks them out of cold memory; copying each sample into its row while
    it is still in the CPU cache, and freeing it, lets the allocator hand the same hot memory to the
    next sample. Samples under :data:`GROUP_BYTES` wait for their group (the group is still in the CPU
    cache) and are checked and stacked together, with collate's own checks. ``add`` returns None while
    samples fit the slot's layout; on the first that does not (another shape, dtype or structure; for a
    small sample, the first group that does not) it frees the slot and returns every sample so far as
    plain objects, and the caller goes on without the stacker (torch's collate then decides).
    """

    def __init__(self, ring: WorkerRing, slot: int, n: int) -> None:
        self.ring, self.slot, self.n = ring, slot, n
        self.base = HEADER_BYTES + slot * ring.slot_bytes
        start = ring.segment.array(np.uint8, self.base, 1).ctypes.data
        self._slot_range = (start, start + ring.slot_bytes)  # the slot's addresses in this process
        self.count = 0  # samples added: rows written (stacked) and samples waiting for their group
        self.stacked = 0
        self._pending: list = []  # samples added and not written yet (small ones wait for their group)
        self._group = 1  # samples per group (GROUP_BYTES), known from the first sample's layout
        self._leaves: list[tuple[int, torch.dtype, tuple, type, Any]] = []  # off, dtype, shape, type, rows
        self._scalars: list[list] = []
        self._lent: dict[int, torch.Tensor] = {}  # leaf -> its row a transform was given, this sample
        self.in_place = 0  # samples whose tensors were all written straight into their rows

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """The next sample's row of a tensor leaf of this ``shape`` and ``dtype`` not lent yet, for a
        transform to write its output into (:func:`coordl.output_buffers.new_output`); else None.

        Known from the batch's first sample on (its layout places the rows).
        """
        if self.count >= self.n:
            return None
        for k, (_off, dtype_k, shape_k, kind, rows) in enumerate(self._leaves):
            if kind is torch.Tensor and dtype_k == dtype and shape_k == shape and k not in self._lent:
                row = rows[self.count]
                self._lent[k] = row
                return row
        return None

    def add(self, sample: Any) -> list | None:
        """Stack ``sample`` as the batch's next row (None), or give up on the slot (the samples so far).

        Per sample, so kept lean: a transform usually returns the very row it was lent (``take``),
        which is recognised by identity and needs neither a layout check nor a copy.
        """
        lent = self._lent
        if not lent and self._group > 1 and self._leaves:
            # A small sample no transform wrote in place: held until its group is full, then checked and
            # stacked with it, as collate would (a group that does not fit sends the batch to collate).
            self._pending.append(sample)
            self.count += 1
            if len(self._pending) >= self._group and not self._flush():
                return self.abort()
            return None
        if lent:
            self._lent = {}
        values: list = []
        scalars: list = []
        if not flatten(self.ring.spec, sample, values, scalars):
            return self._give_up(sample, bool(lent))
        if not self._leaves:
            if not self._lay_out(values):
                return self._give_up(sample, bool(lent))
            self._scalars = [[] for _ in scalars]
        if self._pending and not self._flush():
            return self._give_up(sample, bool(lent))
        count = self.count
        in_slot = False
        for k, ((_off, dtype, shape, kind, rows), value) in enumerate(zip(self._leaves, values, strict=True)):
            if lent and (value is lent.get(k) or _is_row(value, rows, count)):
                values[k] = _IN_PLACE  # written straight into its row by the transform
                continue
            if type(value) is not kind or not _fits(value, dtype, shape):
                return self._give_up(sample, bool(lent))
            in_slot = in_slot or (bool(lent) and type(value) is torch.Tensor and self._in_slot(value))
        if in_slot:
            # Another leaf's row (or a view of one) came back: cloned before any row is written over it.
            values = [v.clone() if type(v) is torch.Tensor and self._in_slot(v) else v for v in values]
        copied = 0
        for (*_layout, rows), value in zip(self._leaves, values, strict=True):
            if value is _IN_PLACE:
                continue
            copied += 1
            if type(value) is torch.Tensor:
                rows[count].copy_(value)
            else:
                rows[count] = value
        for acc, value in zip(self._scalars, scalars, strict=True):
            acc.append(value)
        self.in_place += copied == 0
        self.count = self.stacked = count + 1
        return None

    def _flush(self) -> bool:
        """Stack the samples waiting for their group into their rows, with collate's checks (the same
        structure, and per leaf the type, dtype and shape of the batch's first sample); False when one
        does not fit, or the stack fails (a tensor that requires grad, on another device...)."""
        pending, start = self._pending, self.stacked
        end = start + len(pending)
        rings: list[list] = []
        scalars: list[list] = []
        if not gather(self.ring.spec, pending, rings, scalars):
            return False
        try:
            for (_off, dtype, shape, kind, rows), column in zip(self._leaves, rings, strict=True):
                layout = leaf_layout(column) if type(column[0]) is kind else None
                if layout is None or layout[0] != dtype or tuple(layout[1]) != shape:
                    return False
                (np.stack if type(rows) is np.ndarray else torch.stack)(column, out=rows[start:end])
        except Exception:  # noqa: BLE001 - the samples go to collate as they are, which raises its own error
            return False
        for acc, column in zip(self._scalars, scalars, strict=True):
            acc.extend(column)
        pending.clear()
        self.stacked = end
        return True

    def _in_slot(self, value: torch.Tensor) -> bool:
        return self._slot_range[0] <= value.data_ptr() < self._slot_range[1]

    def _give_up(self, sample: Any, lent: bool) -> list:
        """:meth:`abort` plus this sample; a row lent to it is copied out before the slot goes back."""
        if lent:
            sample = _unalias(sample, self._slot_range)
        return self.abort() + [sample]

    def _lay_out(self, values: list) -> bool:
        """Place each leaf's ``n`` rows in the slot, from the first sample's layout."""
        offset = sample_bytes = 0
        for value in values:
            layout = leaf_layout([value])
            if layout is None or offset + self.n * layout[2] > self.ring.slot_bytes:
                self._leaves = []
                return False
            dtype, shape, per_sample = layout
            rows = self.ring.rows(self.base + offset, self.n * per_sample, dtype, (self.n, *shape), value)
            self._leaves.append((offset, dtype, tuple(shape), type(value), rows))
            sample_bytes += per_sample
            offset = align(offset + self.n * per_sample, ALIGN)
        self._group = max(1, GROUP_BYTES // max(1, sample_bytes))
        return bool(self._leaves)

    def abort(self) -> list:
        """Free the slot; the samples stacked so far, rebuilt as default_collate would see them."""
        out = []
        for k in range(self.stacked):
            leaves = [
                rows[k].clone() if kind is torch.Tensor else rows[k].copy()
                for *_l, kind, rows in self._leaves
            ]
            out.append(build(self.ring.spec, iter(leaves), iter([acc[k] for acc in self._scalars])))
        out.extend(self._pending)  # waiting for their group: the samples themselves
        self._release()
        return out

    def finish(self) -> Stacked | list:
        """The batch for collate: a :class:`Stacked` descriptor, or ``[]`` if every sample was skipped."""
        if self.count == 0:
            self._release()
            return []
        if self._pending and not self._flush():
            return self.abort()
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
            self.ring.receiver,
        )
        batch.stacked = True
        batch.in_place = self.in_place
        return Stacked(batch)

    def _release(self) -> None:
        self._leaves, self._pending = [], []
        self.ring.states[self.slot] = FREE


def _is_row(value: Any, rows: Any, count: int) -> bool:
    """``value`` is the row ``count`` of ``rows`` itself (written in place), not a copy or another view."""
    if type(value) is not torch.Tensor:
        return False
    row = rows[count]
    return (
        value.data_ptr() == row.data_ptr()
        and value.dtype == row.dtype
        and value.shape == row.shape
        and value.stride() == row.stride()
    )


def _fits(value: Any, dtype: torch.dtype, shape: tuple) -> bool:
    """``value`` has the leaf's layout (what :func:`coordl.ring.layout.leaf_layout` gave its first row)."""
    layout = leaf_layout([value])
    return layout is not None and layout[0] == dtype and tuple(layout[1]) == shape


def _unalias(sample: Any, slot: tuple[int, int]) -> Any:
    """``sample`` with every tensor that views the slot's memory cloned (containers rebuilt only then)."""
    if type(sample) is torch.Tensor:
        return sample.clone() if slot[0] <= sample.data_ptr() < slot[1] else sample
    if isinstance(sample, (tuple, list)):
        items = [_unalias(x, slot) for x in sample]
        if all(a is b for a, b in zip(items, sample, strict=True)):
            return sample
        if isinstance(sample, tuple) and hasattr(sample, "_fields"):  # namedtuple
            return type(sample)(*items)
        return type(sample)(items)
    if isinstance(sample, dict):
        mapped = {k: _unalias(v, slot) for k, v in sample.items()}
        return sample if all(mapped[k] is v for k, v in sample.items()) else type(sample)(mapped)
    return sample

"""What a ``DALILoader``'s external source is fed each epoch: its own batch order, or a coordinated group's.

Two modes behind one :class:`EpochFeed`:

* planned (the default): each epoch's batches are drawn here (:class:`coordl.dali.order.BatchOrder`) and
  written into a shared :class:`~coordl.dali.feed.EpochPlan` before DALI starts the epoch; DALI's worker
  processes run :class:`~coordl.dali.feed.BatchFeed`, which reads the plan and fetches the raw bytes;
* coordinated (``coordinate=``): the group's producers fetch each batch once for all its jobs into a
  shared ring (:mod:`coordl.dali.coordinated`); the callback, run in the main process, copies it out.

Either way :meth:`EpochFeed.start` opens an epoch and :meth:`EpochFeed.stop` ends one the user left early.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from coordl.dali.coordinated import CoordinatedFeed, join_raw_group
from coordl.dali.feed import BatchFeed, EpochPlan
from coordl.dali.order import BatchOrder
from coordl.fetch.pipeline import LoaderSource

__all__ = ["EpochFeed"]


class EpochFeed:
    """DALI's external-source callback (:attr:`callback`) and the epochs it serves.

    Args:
        order: the loader's batch order (planned mode; in coordinated mode its sampler and shuffle go
            to the group).
        reader, labels: the fetch path and every item's label.
        batch_size, drop_last: as the loader's.
        coordinate: a group name or ``Group`` (None: planned mode).
        py_num_workers: DALI's worker processes asked for; :attr:`py_num_workers` is what the pipeline
            gets (0 in coordinated mode).
        fetch_threads: storage reads in flight per worker (planned mode).
    """

    def __init__(
        self,
        order: BatchOrder,
        reader: LoaderSource,
        labels: np.ndarray,
        *,
        batch_size: int,
        drop_last: bool,
        coordinate: Any,
        py_num_workers: int,
        fetch_threads: int,
    ) -> None:
        self.order = order
        self.member: Any = None
        self.plan: EpochPlan | None = None
        self._coordinated: CoordinatedFeed | None = None
        self.py_num_workers = py_num_workers
        if coordinate is not None:
            self.member = join_raw_group(
                coordinate, reader=reader, labels=labels, batch_size=batch_size, shuffle=order.shuffle,
                drop_last=drop_last, sampler=order.sampler, producers=max(1, py_num_workers), mp_context=None,
            )  # fmt: skip
            self._coordinated = CoordinatedFeed()
            self.callback: Any = self._coordinated
            self.py_num_workers = 0  # the bytes are in the group's ring: the callback only copies them out
        else:
            self.plan = EpochPlan(len(order), len(order) * batch_size)
            self.callback = BatchFeed(self.plan, reader, labels, fetch_threads)

    def __len__(self) -> int:
        return len(self.member) if self.member is not None else len(self.order)

    def start(self, dali_epoch: int) -> list[list[int]]:
        """Open DALI epoch ``dali_epoch``; returns its batches (planned mode; [] when the group decides)."""
        if self._coordinated is not None:
            self._coordinated.start(self.member.epoch())
            return []
        batches = self.order.draw()
        if self.plan is not None:  # always, in planned mode
            self.plan.write(dali_epoch, batches)
        return batches

    def stop(self) -> None:
        """End the current epoch early: batches not yet scheduled are not fetched."""
        if self.plan is not None:
            self.plan.stop()
        if self._coordinated is not None:
            self._coordinated.stop()

    def close(self) -> None:
        for obj in (self.member, self.plan):
            if obj is not None:
                obj.close()

"""When a stage directory stops taking copies: its byte budget, the disk's free space, a full disk.

Staging stops for good in a process (reads of the rest go to the remote source) at the first of: the
manifest's total plus the next copy passing ``budget_bytes``, the disk's free space falling under
``min_free_bytes``, or a write failing with ENOSPC (:meth:`StageBudget.stop`). With a budget, the check
and the manifest record are one step across processes (:meth:`StageBudget.held`, a node-wide lock):
without it two processes staging different files both saw room for one and the budget was overshot
(seen: 92.7 MB staged in 89.7 MB).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator

from nfs_cache.layout import StageLayout
from nfs_cache.locks import StripedLocks
from nfs_cache.manifest import Manifest

__all__ = ["StageBudget"]


class StageBudget:
    """The room left for copies in one process's view of a stage directory.

    Args:
        layout, manifest: the stage directory and its manifest (what is staged counts against the budget).
        budget_bytes: the most bytes staged in all (None: no cap).
        min_free_bytes: free space to leave on the stage disk (None: fill it up to the first ENOSPC).
        lock_timeout_s: longest wait for the budget's lock.
    """

    def __init__(
        self,
        layout: StageLayout,
        manifest: Manifest,
        budget_bytes: int | None,
        min_free_bytes: int | None,
        lock_timeout_s: float,
    ) -> None:
        self.layout = layout
        self.manifest = manifest
        self.budget_bytes = budget_bytes
        self.min_free_bytes = min_free_bytes
        self.lock_timeout_s = lock_timeout_s
        self.lock = StripedLocks(os.path.join(layout.locks, "budget"), stripes=1)
        self.stopped = ""  # why this process stopped staging ("" while it stages)

    def room_for(self, size: int) -> bool:
        """Whether a copy of ``size`` bytes may be staged; False (for good) once the budget or the disk is full."""
        if self.stopped:
            return False
        if self.budget_bytes is not None and self.manifest.total_bytes + size > self.budget_bytes:
            self.stopped = f"budget of {self.budget_bytes} bytes reached"
            return False
        if self.min_free_bytes is None:
            return True
        if shutil.disk_usage(self.layout.root).free - size < self.min_free_bytes:
            self.stopped = f"less than {self.min_free_bytes} bytes free in {self.layout.root}"
            return False
        return True

    def stop(self, reason: str) -> None:
        """Stop staging in this process (a full disk found by a write)."""
        self.stopped = reason

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The budget's check and the manifest record as one step across processes (no lock without a budget)."""
        if self.budget_bytes is None:
            yield
            return
        with self.lock.hold("budget", self.lock_timeout_s):
            self.manifest.refresh()  # what other processes staged counts against the budget
            yield

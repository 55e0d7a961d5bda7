"""torch's iterator for one pass, as the resumable state sees it: every batch handed out is reported."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from coordl.resume.workers import EndBatch, PadBatch, Tagged

__all__ = ["PassTracker", "torch_iterator"]


class PassTracker:
    """torch's iterator for one pass, seen by the loader's state: unwraps :class:`Tagged` batches, drops
    pad batches, a stream's end batches (after noting the worker's state) and those a fast-forward
    replays, and reports every batch handed out.

    Any other attribute is torch's iterator's (coordl's error translation reads its workers).

    Args:
        torch_iter: torch's iterator of the pass.
        resume: the loader's :class:`~coordl.resume.loader.Resume`.
        pass_id: the pass this iterator is.
        discard: batches to drop first (a stream replayed up to where it was saved).
        release: called with each dropped batch (the batch ring's unwrap, so its slot is freed).
    """

    def __init__(
        self, torch_iter: Any, resume: Any, pass_id: int, *, discard: int = 0, release: Callable | None = None
    ) -> None:
        self.torch_iter = torch_iter
        self.resume = resume
        self.pass_id = pass_id
        self.discard = discard
        self.release = release

    def __iter__(self) -> PassTracker:
        return self

    def __next__(self) -> Any:
        while True:
            try:
                batch = next(self.torch_iter)
            except StopIteration:
                self.resume.pass_ended(self.pass_id)
                raise
            except Exception as error:
                if not _timed_out(error):  # the batch's error: torch goes on with the next batch
                    self.resume.batch_done(self.pass_id, None)
                raise
            if isinstance(batch, PadBatch):
                continue
            tag = None
            if isinstance(batch, Tagged):
                tag, batch = batch, batch.batch
            if isinstance(batch, EndBatch):
                self.resume.worker_ended(self.pass_id, tag)
                continue
            if self.discard > 0:
                self.discard -= 1
                if self.release is not None:
                    self.release(batch)
                continue
            self.resume.batch_done(self.pass_id, tag)
            return batch

    def __len__(self) -> int:
        return len(self.torch_iter)

    def __getattr__(self, name: str) -> Any:
        torch_iter = self.__dict__.get("torch_iter")
        if torch_iter is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(torch_iter, name)


def torch_iterator(it: Any) -> Any:
    """torch's own iterator behind ``it`` (a :class:`PassTracker`, or already torch's)."""
    return it.torch_iter if isinstance(it, PassTracker) else it


def _timed_out(error: Exception) -> bool:
    """torch's ``timeout=`` expired: the batch is still to come (a later ``next`` may get it)."""
    return isinstance(error, RuntimeError) and str(error).startswith("DataLoader timed out")

"""torch's iterator for one pass, as the resumable state sees it: every batch handed out is reported
(:class:`PassTracker`) and noted (:class:`PassProgress`: which batches of the epoch, each worker's
state after its last one)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from coordl.resume.order import ResumableSampler
from coordl.resume.workers import EndBatch, PadBatch, ResumableStream, Tagged

__all__ = ["PassProgress", "PassTracker", "torch_iterator"]


class PassProgress:
    """What a pass has handed out, noted batch by batch (a base of :class:`~coordl.resume.loader.Resume`,
    whose attributes it reads and sets): the lowest batch number of the epoch not handed out yet and
    the numbers above it handed out already (out of order), the sampler's state after the lowest, and
    each worker's state as it sent it with its last batch (or with a pad, or after its stream's end)."""

    # Made by Resume.__init__ (described there): declared here, where they are also read and set.
    order: ResumableSampler | None
    stream: ResumableStream | None
    epoch: int
    in_epoch: bool
    batches_done: int
    handed: set[int]
    pass_id: int
    persistent: bool
    sampler_state: dict[str, Any] | None
    worker_states: dict[int, Any]
    last_worker: int | None

    def batch_done(self, pass_id: int, tag: Tagged | None) -> None:
        """A batch of pass ``pass_id`` was handed out (or dropped: every item skipped, or its error raised).

        Its number in the epoch is the tag's (a batch handed out of order), else the lowest not handed
        out yet; each worker's state is the one it sent with the last batch handed out from it."""
        if pass_id != self.pass_id:
            return  # an iterator of an earlier pass, or of one a load replaced
        number = tag.number if tag is not None else None
        if number is not None and number > self.batches_done:
            self.handed.add(number)  # overtook batches still being made
        else:
            self._handed_next()
        while self.handed and self.batches_done in self.handed:
            self.handed.discard(self.batches_done)
            self._handed_next()
        if tag is None:
            return
        if tag.state is not None:
            self.worker_states[tag.worker] = tag.state
        self.last_worker = tag.worker

    def _handed_next(self) -> None:
        """The lowest batch not handed out yet was: the sampler's state is the one after it."""
        self.batches_done += 1
        if self.order is not None and self.order.snapshots:
            self.sampler_state = self.order.snapshots.popleft()

    def note_worker(self, pass_id: int, tag: Tagged | None) -> None:
        """A worker of pass ``pass_id`` sent its state without a batch: after its stream ended, or with a
        pad batch (its state when the pass began)."""
        if pass_id == self.pass_id and tag is not None and tag.state is not None:
            self.worker_states[tag.worker] = tag.state

    def pass_ended(self, pass_id: int) -> None:
        if pass_id != self.pass_id or not self.in_epoch:
            return
        self.in_epoch = False
        self.epoch += 1
        self.batches_done = 0
        self.handed = set()
        if self.order is not None:
            self.order.snapshots.clear()
        if not self.persistent:
            self.worker_states, self.last_worker = {}, None
            return
        if self.stream is not None:  # the next pass makes new iterators; the datasets (and RNGs) live on
            kept = {w: {**s, "ended": False, "renew": True} for w, s in self.worker_states.items()}
            self.worker_states = kept


class PassTracker:
    """torch's iterator for one pass, seen by the loader's state: unwraps :class:`Tagged` batches, drops
    pad batches and a stream's end batches (after noting the worker's state they carry) and those a
    fast-forward replays, and reports every batch handed out.

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
            tag = None
            if isinstance(batch, Tagged):
                tag, batch = batch, batch.batch
            if isinstance(batch, (PadBatch, EndBatch)):
                self.resume.note_worker(self.pass_id, tag)
                continue
            if self.discard > 0:
                self.discard -= 1
                if self.release is not None:
                    self.release(batch)
                continue
            self.resume.batch_done(self.pass_id, tag)
            return batch

    def take_pads(self, n: int) -> None:
        """Take the pass's first ``n`` batches now, pads that carry their workers' states (in order)."""
        for _ in range(n):
            batch = next(self.torch_iter)
            assert isinstance(batch, Tagged) and isinstance(batch.batch, PadBatch), type(batch)
            self.resume.note_worker(self.pass_id, batch)

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

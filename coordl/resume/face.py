"""The resumable state on a loader's face: ``state_dict()`` / ``load_state_dict()`` of
:class:`coordl.DataLoader`, torchdata's ``StatefulDataLoader`` methods, handed to the loader's
:class:`~coordl.resume.loader.Resume` (or, for a job of a coordination group, to its group state)."""

from __future__ import annotations

from typing import Any

from coordl.resume.loader import Resume
from coordl.resume.state import group_state, load_group_state

__all__ = ["ResumableLoader"]


class ResumableLoader:
    """``state_dict`` / ``load_state_dict`` for :class:`coordl.DataLoader` (a base of it: it reads the
    loader's ``_resume``, ``_member``, ``_torch``, ``_iterable``, ``dataset`` and ``source``)."""

    # what it reads of the loader it is a base of (set by coordl.DataLoader.__init__)
    _resume: Resume | None
    _member: Any
    _torch: Any
    _iterable: bool
    dataset: Any
    source: Any

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is: a dict of plain data for :meth:`load_state_dict` (torchdata's
        ``StatefulDataLoader`` meaning; JSON-serialisable when the dataset's and sampler's own states are).

        Taken at any point (before ``iter``, inside an epoch, between epochs), it holds the epoch, the
        batches already handed out in it, the shuffling generators' states when it began, and the
        ``state_dict()`` of a sampler, dataset or stream iterator that has one, per worker where they
        live; no data, O(workers). See :mod:`coordl.resume` and docs/dataloader.md.
        """
        if self._member is not None:
            return group_state(self._member, self._shape())
        return self._resumable().state_dict(self._shape())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict` of a loader built with the same arguments).

        The next ``iter`` yields exactly the batches that had not been handed out, in the same order;
        later epochs follow as in an uninterrupted run. Called while an epoch runs, that epoch is
        dropped (persistent workers are restarted). A state of another shape (``num_workers``, the
        dataset's length, ...) is refused naming both values.
        """
        if isinstance(state, dict) and not state:
            return  # no state saved (torchdata's meaning of {}): the loader goes on as it is
        if self._member is not None:
            load_group_state(self._member, state, self._shape())
            return
        self._resumable().load_state_dict(state, self._shape())

    def _resumable(self) -> Resume:
        assert self._resume is not None  # only a coordinated loader has none, and it has a member
        return self._resume

    def _shape(self) -> dict[str, Any]:
        """What a saved state must agree on with this loader."""
        shape = {
            "iterable": self._iterable,
            "num_items": _length(self.dataset if self._iterable else self.source),
            "batch_size": self._torch.batch_size,
            "drop_last": bool(self._torch.drop_last),
            "num_workers": self._torch.num_workers,
        }
        if not self._iterable:
            shape["batches_per_epoch"] = len(self)  # type: ignore[arg-type]  # the loader it is a base of has a length
        return shape


def _length(dataset: Any) -> int | None:
    """``len(dataset)``, or None for a stream without one."""
    try:
        return len(dataset)
    except TypeError:
        return None

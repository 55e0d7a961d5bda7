"""The worker side of resuming: each worker's dataset (and stream) state travels with its batches.

A worker's state must be the one it had right after the batch the user last got from it, not after the
batches it made ahead. So, as in torchdata, the state goes with each batch: :class:`TaggingCollate`
wraps the collate function torch runs in the worker and returns :class:`Tagged` (the batch, the worker
id and the worker's state after it); the main process unwraps it when the batch is handed out
(:class:`coordl.resume.loader.PassTracker`). Restoring happens where the state lives: in each new
worker, after the user's ``worker_init_fn`` (:class:`WorkerRestore`), or, for an ``IterableDataset``,
when torch asks the worker for its iterator (:class:`ResumableStream`).

Resuming a stream mid-epoch must also give the batches in the order the uninterrupted run would
have: torch hands batch ``i`` of a pass to worker ``i % num_workers`` (skipping workers that have
ended), so after the user got a batch from worker ``L``, the next one comes from worker ``L + 1``. A
resumed pass starts at worker 0 again, so workers ``0..L`` each first make one pad batch
(:data:`PAD` items, collated to :class:`PadBatch`), which the main process drops. A map-style pass
does the same with pad indices from its sampler (:class:`coordl.resume.order.ResumableSampler`), which
the fetch passes through untouched: every worker keeps its own state and its turns. A map-style
worker's pad carries its state (the one it begins the pass with), and a batch handed out of order
carries its number in the epoch, which its first index brought to the worker's fetch
(:func:`note_batch`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import torch.utils.data
from torch.utils.data._utils.pin_memory import pin_memory

from coordl.resume.state import is_stateful

__all__ = [
    "END",
    "PAD",
    "DatasetState",
    "EndBatch",
    "PadBatch",
    "ResumableStream",
    "Tagged",
    "TaggingCollate",
    "WorkerRestore",
]


class _Pad:
    """The item a pad batch is made of (never reaches collate or the user)."""

    def __repr__(self) -> str:
        return "coordl.resume.PAD"

    def __reduce__(self) -> str:
        return "PAD"  # unpickled (in a worker: a map-style pad index travels there) as this module's PAD


PAD = _Pad()


class _End:
    """The items that follow a worker's last one in a pass (never reach collate or the user)."""

    def __repr__(self) -> str:
        return "coordl.resume.END"

    def __reduce__(self) -> str:
        return "END"


END = _End()


class PadBatch:
    """A batch of pads: it only moves torch's turn to the next worker; the main process drops it."""


class EndBatch:
    """A worker's stream ended: its batch carries the worker's state after the end (a Stateful
    dataset that resets itself there says "the next epoch, from its start"); the main process keeps
    the state and drops the batch, as torch drops the worker's end."""


class Tagged:
    """A batch with the state of the worker that made it, right after making it.

    Args:
        batch: what the collate function returned.
        worker: the id of the worker process that made it.
        state: that worker's dataset (and stream) state after it (None: nothing Stateful).
        number: the batch's number in the epoch, when the sampler numbered it (``in_order=False``).
    """

    __slots__ = ("batch", "worker", "state", "number")

    def __init__(self, batch: Any, worker: int, state: Any, number: int | None = None) -> None:
        self.batch, self.worker, self.state, self.number = batch, worker, state, number

    def __reduce__(self) -> tuple:
        return (Tagged, (self.batch, self.worker, self.state, self.number))

    def pin_memory(self) -> Tagged:
        """torch's pin-memory thread pins what it finds inside (it calls this on objects that have it)."""
        return Tagged(pin_memory(self.batch), self.worker, self.state, self.number)


# The number of the batch this worker is making, noted by the fetch (:func:`note_batch`) and read by
# the collate that follows it in the same worker (:class:`TaggingCollate`): torch's worker loop
# fetches a batch's items and collates them in one call, one batch at a time.
_making: list[int | None] = [None]


def note_batch(number: int) -> None:
    """The batch a worker fetches now has this number in the epoch (its first index carried it)."""
    _making[0] = number


class DatasetState:
    """The state a map-style dataset's worker reports: the user's dataset's ``state_dict()`` (None when
    it has none)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.stateful = is_stateful(dataset)

    def worker_state(self) -> Any:
        return self.dataset.state_dict() if self.stateful else None


class TaggingCollate:
    """Wraps a worker's collate function: pads become :class:`PadBatch`, every other batch leaves the
    worker as :class:`Tagged` with the state ``holder.worker_state()`` reports and the batch's number
    when the fetch noted one (neither: no tag).

    A batch that holds :data:`END` items is a stream's last in the worker: its real items (if any, and
    unless ``drop_last`` would have dropped them as a partial batch) are collated, and the state it
    carries says the stream ended.

    Args:
        collate_fn: the collate function torch would run.
        holder: :class:`DatasetState` or :class:`ResumableStream` (the copy in the worker).
        drop_last: the loader's ``drop_last`` (a partial last batch is dropped).
    """

    def __init__(self, collate_fn: Callable[[Any], Any], holder: Any, drop_last: bool = False) -> None:
        self.collate_fn = collate_fn
        self.holder = holder
        self.drop_last = drop_last
        # a map-style worker's pad carries its state: the state it starts the pass with
        self.pad_state = isinstance(holder, DatasetState) and holder.stateful

    def __call__(self, batch: Any) -> Any:
        if batch is PAD or (isinstance(batch, list) and batch and all(item is PAD for item in batch)):
            info = torch.utils.data.get_worker_info()
            if not self.pad_state or info is None:
                return PadBatch()
            return Tagged(PadBatch(), info.id, copy.deepcopy(self.holder.worker_state()))
        items, ended = _strip_end(batch)
        if ended and (not items or self.drop_last):
            out: Any = EndBatch()
        else:
            out = self.collate_fn(items if ended else batch)
        info = torch.utils.data.get_worker_info()
        if info is None:  # the main process: its state is read when the loader's state is taken
            return out
        number, _making[0] = _making[0], None
        # A copy: torch pickles the batch in a feeder thread later, by when the dataset has moved on.
        state = copy.deepcopy(self.holder.worker_state())
        if ended:
            state = {**(state or {}), "ended": True}
        return out if state is None and number is None else Tagged(out, info.id, state, number)


def _strip_end(batch: Any) -> tuple[Any, bool]:
    """``(batch without its END items, whether it had any)``."""
    if batch is END:
        return [], True
    if isinstance(batch, list) and batch and batch[-1] is END:
        return [item for item in batch if item is not END], True
    return batch, False


class WorkerRestore:
    """The ``worker_init_fn`` of a resumed pass's new workers: the user's, then the dataset's state.

    Args:
        user_fn: the user's ``worker_init_fn`` (or None).
        dataset: the user's map-style dataset (the worker's copy is restored).
        states: worker id -> the state to load into that worker's dataset.
    """

    def __init__(self, user_fn: Callable[[int], None] | None, dataset: Any, states: dict[int, Any]) -> None:
        self.user_fn = user_fn
        self.dataset = dataset
        self.states = states

    def __call__(self, worker_id: int) -> None:
        if self.user_fn is not None:
            self.user_fn(worker_id)
        state = self.states.get(worker_id)
        if state is not None:
            self.dataset.load_state_dict(state)


class ResumableStream(torch.utils.data.IterableDataset):
    """What torch iterates instead of the user's ``IterableDataset``: the same items, plus a restore.

    Each process (a worker, or the main one without workers) restores, at the start of a pass, the
    state meant for it (the dataset's state, then a new iterator, then the iterator's state: torchdata's
    order; a worker whose stream had ended makes no new iterator), emits its pad batch when it has one,
    and reports its state after each batch; a worker ends its pass with :data:`END` items that fill its
    last batch (or make one), so that its state after the end reaches the main process. Any other
    attribute is the user's dataset's (read and set: a ``worker_init_fn`` that configures
    ``get_worker_info().dataset`` configures the user's dataset).

    Args:
        dataset: the user's ``IterableDataset``.
        pad_items: items per batch torch takes from the iterator (``batch_size``, or 1 without batching).
    """

    _OWN = frozenset({"dataset", "pad_items", "pending", "current"})

    def __init__(self, dataset: Any, pad_items: int) -> None:
        object.__setattr__(self, "dataset", dataset)
        object.__setattr__(self, "pad_items", max(1, pad_items))  # items per batch torch takes
        # process key (worker id, or None for the main process) -> {"dataset", "iter", "pads"}
        object.__setattr__(self, "pending", {})
        object.__setattr__(self, "current", None)  # the user's iterator of the pass running here

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        plan = self.pending.pop(info.id if info is not None else None, None) or {}
        if plan.get("dataset") is not None:
            self.dataset.load_state_dict(plan["dataset"])
        ended, renew = plan.get("ended"), plan.get("renew")
        it = None
        if ended or renew or plan.get("iter") is not None:
            it = iter(self.dataset)
            if plan.get("iter") is not None and is_stateful(it):
                it.load_state_dict(plan["iter"])  # (for an ended one: what restoring it does, its RNG)
        if ended:  # this worker had finished the pass: it only keeps its turn
            object.__setattr__(self, "current", it)
            it = iter(())
        else:
            if renew or it is None:  # a state from the end of the previous pass: this pass starts anew
                it = iter(self.dataset)
            object.__setattr__(self, "current", it)
        pads = int(plan.get("pads", 0)) * self.pad_items
        if info is None:  # the main process: its state is read when the loader's state is taken
            return self._padded(it, pads) if pads else it
        return self._reported(it, pads)

    @staticmethod
    def _padded(it: Iterator[Any], pads: int) -> Iterator[Any]:
        for _ in range(pads):
            yield PAD
        while (
            True
        ):  # not ``yield from it``: that calls iter(it), and a dataset that is its own iterator restarts
            try:
                item = next(it)
            except StopIteration:
                return
            yield item

    def _reported(self, it: Iterator[Any], pads: int) -> Iterator[Any]:
        """A worker's items: its pads, the stream's items, then END items up to the end of a batch."""
        count = 0
        for item in self._padded(it, pads):
            count += item is not PAD
            yield item
        for _ in range(self.pad_items - count % self.pad_items):
            yield END

    def worker_state(self, *, with_iter: bool = True) -> dict[str, Any] | None:
        """``{"dataset": ..., "iter": ...}`` of this process now, or None when neither is Stateful."""
        it = self.current
        own = it is not None and it is not self.dataset
        data = self.dataset.state_dict() if is_stateful(self.dataset) and (own or it is None) else None
        state = it.state_dict() if with_iter and it is not None and is_stateful(it) else None
        if data is None and state is None:
            return None
        return {"dataset": data, "iter": state}

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str) -> Any:
        dataset = self.__dict__.get("dataset")
        if dataset is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(dataset, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.dataset, name, value)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "current"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)
        object.__setattr__(self, "current", None)

    def __repr__(self) -> str:
        return f"coordl resumable stream of {self.dataset!r}"

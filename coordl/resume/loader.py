"""A loader's resumable state: what a pass has handed out, and everything needed to hand out the rest.

:class:`Resume` keeps, per pass: the epoch, the batches handed out (including those dropped because
every item was skipped), the state of each generator that orders the pass when it began, the state
of a Stateful sampler after the last batch handed out, each worker's dataset state after the last
batch it gave (or the main process's, without workers), and for a stream the worker that gave the last
batch. :class:`~coordl.resume.tracker.PassTracker` wraps torch's iterator to see each batch as it is
handed out. All of it
is O(workers): nothing grows with the dataset. Taking a state in and applying it at the next pass is
:class:`~coordl.resume.restore.ResumeRestore`'s part.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.data
from torch.utils.data.dataloader import default_collate, default_convert

from coordl.resume.order import ResumableSampler
from coordl.resume.restore import ResumeRestore
from coordl.resume.state import (
    STATE_FORMAT,
    STATE_VERSION,
    encode_generator_state,
    encode_rng_state,
    encode_runs,
    is_stateful,
    torch_generator,
)
from coordl.resume.tracker import PassProgress, PassTracker
from coordl.resume.workers import DatasetState, ResumableStream, TaggingCollate, WorkerRestore
from coordl.shutdown import stop_workers

__all__ = ["Resume"]

log = logging.getLogger("coordl")


def _private_generator() -> torch.Generator:
    """The generator of a shuffle without ``generator=``: seeded once from torch's global RNG, the
    draw torch's ``RandomSampler`` (and torchdata's) makes, so the loader's passes follow from it and
    its state can be saved."""
    seed = int(torch.empty((), dtype=torch.int64).random_().item())
    return torch.Generator().manual_seed(seed)


class Resume(ResumeRestore, PassProgress):
    """The order and progress of a loader's passes, kept resumable (see the module docstring).

    Args:
        dataset: the dataset torch iterates (for the default samplers).
        user_dataset: the user's dataset (its ``state_dict``/``load_state_dict`` are used when it has them).
        sampler, batch_sampler, shuffle, batch_size, generator: the loader's arguments (``sampler``
            already replaced by the partitioned sampler where that applies).
        iterable: ``user_dataset`` is an ``IterableDataset``.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        user_dataset: Any = None,
        sampler: Any,
        batch_sampler: Any,
        shuffle: bool | None,
        batch_size: int | None,
        generator: torch.Generator | None,
        iterable: bool = False,
        drop_last: bool = False,
    ) -> None:
        self.generator = generator
        self._drop_last = drop_last
        self.user_dataset = dataset if user_dataset is None else user_dataset
        self.iterable = iterable
        self._args = (None, None, shuffle) if iterable else (sampler, batch_sampler, shuffle)
        self._auto_collation = batch_size is not None or batch_sampler is not None
        self.shuffle_generator: torch.Generator | None = None
        self.order: ResumableSampler | None = None
        # A torch DataPipe goes to torch as it is: torch shuffles it (shuffle=True), seeds it each epoch and
        # shards it between workers (sharding_filter) only when it sees the DataPipe itself. Resuming one
        # replays the epoch's first batches (it has no state_dict).
        datapipe = isinstance(self.user_dataset, torch.utils.data.IterDataPipe)
        self.stream = (
            ResumableStream(self.user_dataset, batch_size or 1) if iterable and not datapipe else None
        )
        if iterable:
            pass
        elif batch_sampler is not None:
            self.order = ResumableSampler(batch_sampler, batched=True)
        else:
            if sampler is None:  # what torch would make, so the order is torch's for the same generator
                sampler = (
                    torch.utils.data.RandomSampler(dataset, generator=generator)
                    if shuffle
                    else torch.utils.data.SequentialSampler(dataset)
                )
            if shuffle and generator is None and _unseeded_shuffle(sampler):
                self.shuffle_generator = _private_generator()
            self.order = ResumableSampler(
                sampler, unit=batch_size or 1, shuffle_generator=self.shuffle_generator
            )
        # A generator of the user's sampler (RandomSampler(..., generator=g) given as sampler=): its
        # state when the pass began orders that pass, like the loader's own.
        self.sampler_generator = _sampler_generator(self.order, generator) if self.order is not None else None
        self.epoch = 0  # the epoch running, or the next one between epochs
        self.in_epoch = False
        self.batches_done = 0  # of the pass running: the lowest batch number not handed out yet
        self.handed: set[int] = set()  # numbers above batches_done handed out already (out of order)
        self.pass_id = 0
        self.pass_workers = 0
        self.pass_offset = 0  # batches resumed past at the start of the pass running
        self.persistent = False
        self.in_order = True
        self.pad_turns = True  # a resumed map-style pass keeps torch's turns with pad batches
        self.greet = 0  # the pass starts with a pad from each worker, telling its state
        self.generator_state: str | None = None
        self.shuffle_state: str | None = None
        self.sampler_generator_state: str | None = None
        self.workers_rng: str | None = None  # torch's RNG when the running workers were made
        # torch's RNG before the next pass draws its workers' base seed, when a state taken before the
        # first pass fixed it (torchdata makes the pass's iterator then, and so draws it then)
        self.pinned_rng: str | None = None
        self.sampler_start: dict[str, Any] | None = None
        self.sampler_state: dict[str, Any] | None = None
        self.worker_states: dict[int, Any] = {}
        self.last_worker: int | None = None
        self.plan: dict[str, Any] | None = None  # a loaded state, applied when the next pass starts
        self._restart = False  # the next pass needs new workers (a load, or a rotated resume)

    # -- what torch is built with ----------------------------------------------------------------------

    def torch_arguments(self) -> tuple[Any, Any, bool | None]:
        """``(sampler, batch_sampler, shuffle)`` to build torch's loader with."""
        sampler, batch_sampler, shuffle = self._args
        if self.order is None:
            return sampler, batch_sampler, shuffle
        if self.order.batched:
            return (sampler if batch_sampler is not None else None), self.order, shuffle
        return self.order, None, None

    def for_torch(self, dataset: Any, collate_fn: Callable | None) -> tuple[Any, Callable | None]:
        """``(dataset, collate_fn)`` to build torch's loader with: the stream wrapper for an
        ``IterableDataset``; a collate that reports each worker's state when there is one to report."""
        if self.stream is None and self.order is None:
            return dataset, collate_fn  # a torch DataPipe: torch's own
        # (map-style, any dataset: a resumed pass's pad batches and the numbers of batches handed out
        # out of order pass through it too)
        collate_fn = collate_fn or (default_collate if self._auto_collation else default_convert)
        holder = self.stream if self.stream is not None else DatasetState(self.user_dataset)
        tagging = TaggingCollate(collate_fn, holder, drop_last=self._drop_last)
        return (self.stream if self.stream is not None else dataset), tagging

    # -- a pass -----------------------------------------------------------------------------------------

    def start(
        self,
        torch_loader: Any,
        start_workers: Callable[[Any], Any],
        release: Callable | None = None,
        *,
        turns: bool = True,
    ) -> PassTracker:
        """Start a pass of ``torch_loader`` (``start_workers(torch_loader)`` makes its iterator), with a
        loaded state applied: the main process's parts now, the workers' in the new workers.

        ``turns``: torch's workers take the pass's batches in turn (not so when remote prep shares
        them), so a resumed pass's pads give the first batch to the worker whose turn it was."""
        workers = torch_loader.num_workers
        # (a copy: the parts of it handed to the user's sampler and datasets are theirs to change)
        plan, self.plan = copy.deepcopy(self.plan), None
        self.in_order = bool(getattr(torch_loader, "in_order", True))
        self.pad_turns = turns
        discard = self._begin_pass(workers, plan)
        self.persistent = bool(torch_loader.persistent_workers) and workers > 0
        placed = self._worker_plan(plan, workers)
        live = getattr(torch_loader, "_iterator", None)
        if live is not None and (self._restart or placed):
            stop_workers(live)  # persistent workers hold other states: start new ones
            torch_loader._iterator = live = None
        self._restart = False
        saved = (torch_loader.worker_init_fn, torch_loader.generator)
        rng, pinned, self.pinned_rng = None, self.pinned_rng, None
        if torch_loader.generator is None:
            fixed = (plan or {}).get("rng_state") or pinned
            if fixed:  # the saved pass's worker seeds (torch draws them from it)
                torch_loader.generator = torch_generator(fixed)
            if fixed and not pinned:
                # torch's RNG moves on as it would have when torch drew the seed from it (a user's
                # sampler without a generator draws its order from it next)
                torch.empty((), dtype=torch.int64).random_()
            rng = fixed or (encode_rng_state(torch.get_rng_state()) if workers > 0 else None)
        if placed and self.stream is not None:
            self.stream.pending.update(placed)
        elif placed:
            torch_loader.worker_init_fn = WorkerRestore(saved[0], self.user_dataset, placed)
        try:
            it = start_workers(torch_loader)
        finally:
            torch_loader.worker_init_fn, torch_loader.generator = saved
            if self.stream is not None:
                self.stream.pending.clear()
        if it is not live:
            self.workers_rng = rng
        tracker = PassTracker(it, self, self.pass_id, discard=discard, release=release)
        if self.greet:  # (as torchdata's iterator waits for its persistent workers' states)
            tracker.take_pads(self.greet)
        return tracker

    # -- state ------------------------------------------------------------------------------------------

    def state_dict(self, shape: dict[str, Any]) -> dict[str, Any]:
        """The plain-data state; ``shape`` is what a loader resuming it must agree on."""
        if self.plan is not None:  # loaded, not applied yet: it still says where this loader is
            return {**self.plan, **shape}  # the values loaded, as torchdata returns them (equal to them)
        between = not self.in_epoch
        workers = int(shape.get("num_workers", self.pass_workers))
        if self.pass_id == 0 and self.generator is None and self.pinned_rng is None:
            # Before the first pass: fix its workers' base seed now, and draw it from torch's RNG as
            # torch's iterator would (torchdata makes that iterator here), so that the stream is the
            # same whether or not the state was taken, and the same again when it is resumed.
            self.pinned_rng = encode_rng_state(torch.get_rng_state())
            torch.empty((), dtype=torch.int64).random_()
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            **shape,
            "epoch": self.epoch,
            "batches_done": 0 if between else self.batches_done,
            # (out of order: the batches after it handed out already, as runs [first, last]: a few,
            # however many batches overtook a slow one)
            "handed_out_after": [] if between else encode_runs(self.handed),
            "generator_state": self._generator_state(self.generator, self.generator_state, between),
            "shuffle_state": self._generator_state(self.shuffle_generator, self.shuffle_state, between),
            "sampler_generator_state": self._generator_state(
                self.sampler_generator, self.sampler_generator_state, between
            ),
            "rng_state": self.pinned_rng if between else None if workers == 0 else self.workers_rng,
            "sampler_epoch": None if between or self.order is None else self.order.inner_epoch,
            "sampler": self._sampler_part(between),
            "dataset": copy.deepcopy(self._main_dataset_state(between)) if workers == 0 else None,
            "workers": [copy.deepcopy(self.worker_states.get(i)) for i in range(workers)]
            if workers
            else None,
            "last_worker": None if between else self.last_worker,
        }

    @staticmethod
    def _generator_state(
        generator: torch.Generator | None, at_start: str | None, between: bool
    ) -> str | None:
        if generator is None:
            return None
        return encode_generator_state(generator) if between else at_start

    def _sampler_part(self, between: bool) -> dict[str, Any] | None:
        order = self.order
        if order is None or not order.tracks(order.current):
            return None
        if between:
            return {**order.snapshot(), "drain": order.passes > 0}
        return self.sampler_state if self.sampler_state is not None else self.sampler_start

    def _main_dataset_state(self, between: bool) -> Any:
        if self.stream is not None:
            return self.stream.worker_state(with_iter=not between)
        return self.user_dataset.state_dict() if is_stateful(self.user_dataset) else None


def _sampler_generator(
    order: ResumableSampler, loader_generator: torch.Generator | None
) -> torch.Generator | None:
    """The generator of the user's sampler (or of the sampler inside their batch sampler), when it has
    one of its own."""
    for sampler in (order.inner, getattr(order.inner, "sampler", None)):
        generator = getattr(sampler, "generator", None)
        if isinstance(generator, torch.Generator) and generator is not loader_generator:
            return generator
    return None


def _unseeded_shuffle(sampler: Any) -> bool:
    """torch's default shuffle sampler, drawing a fresh seed from the global RNG every pass."""
    return (
        type(sampler) is torch.utils.data.RandomSampler
        and sampler.generator is None
        and not sampler.replacement
        and sampler._num_samples is None
    )

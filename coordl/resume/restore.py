"""Restoring a loaded state: applied when the next pass starts, in the main process now and in the new
workers when they start.

:class:`ResumeRestore` is the half of :class:`~coordl.resume.loader.Resume` that takes a state in
(``load_state_dict``, checked at once) and, at the next pass, positions the sampler (its own state, or a
fast-forward by the batches handed out), restores the main process's dataset once the sampler is
positioned, and says what each new worker restores (a stream's ended workers, and the pads that give
the turn to the worker whose turn it was).
"""

from __future__ import annotations

import functools
import hashlib
import logging
from typing import Any

import torch
import torch.utils.data

from coordl.resume.order import ResumableSampler
from coordl.resume.state import (
    StateMismatchError,
    check_state,
    decode_generator_state,
    decode_runs,
    encode_generator_state,
    is_stateful,
)
from coordl.resume.workers import ResumableStream

__all__ = ["ResumeRestore"]

log = logging.getLogger("coordl")


class ResumeRestore:
    """Loading a state and applying it at the next pass (a base of :class:`~coordl.resume.loader.Resume`,
    whose attributes it reads and sets)."""

    # Made by Resume.__init__ (described there): declared here, where they are also read and set.
    generator: torch.Generator | None
    shuffle_generator: torch.Generator | None
    sampler_generator: torch.Generator | None
    user_dataset: Any
    order: ResumableSampler | None
    stream: ResumableStream | None
    epoch: int
    in_epoch: bool
    batches_done: int
    pass_id: int
    pass_workers: int
    pass_offset: int
    handed: set[int]
    persistent: bool
    in_order: bool
    pad_turns: bool
    greet: int
    generator_state: str | None
    shuffle_state: str | None
    sampler_generator_state: str | None
    pinned_rng: str | None
    sampler_start: dict[str, Any] | None
    sampler_state: dict[str, Any] | None
    worker_states: dict[int, Any]
    last_worker: int | None
    plan: dict[str, Any] | None
    _restart: bool

    def _begin_pass(self, workers: int, plan: dict[str, Any] | None) -> int:
        """Bookkeeping of a new pass (and the main-process parts of ``plan``); the batches to drop."""
        left_early = self.in_epoch
        if left_early:  # the previous pass was left early: this is the next epoch
            self.epoch += 1
        self.pass_id += 1
        self.in_epoch = True
        self.pass_workers = workers
        skip, self.handed = 0, set()
        if plan is not None:
            self.epoch, skip = int(plan["epoch"]), int(plan["batches_done"])
            self.handed = decode_runs(plan.get("handed_out_after") or [])
            self.worker_states = dict(enumerate(plan.get("workers") or []))
            self.worker_states = {k: v for k, v in self.worker_states.items() if v is not None}
            self.last_worker = plan.get("last_worker")
        elif not self.persistent:
            self.worker_states, self.last_worker = {}, None  # new workers start from the main copy
        self.batches_done, self.pass_offset = skip, skip + len(self.handed)
        self.generator_state = encode_generator_state(self.generator) if self.generator is not None else None
        self.shuffle_state = (
            encode_generator_state(self.shuffle_generator) if self.shuffle_generator is not None else None
        )
        self.sampler_generator_state = (
            encode_generator_state(self.sampler_generator) if self.sampler_generator is not None else None
        )
        self.sampler_state = None
        discard = 0
        if self.order is not None:
            # persistent workers that made batches of a pass left early no one got: their states now
            # are not those of their last batches handed out; each tells it with a pad first
            hello = left_early and plan is None and self.persistent and not self._restart
            discard = self._begin_order(plan, skip, workers, hello=hello)
        elif plan is not None:
            discard = self._begin_stream(plan, skip, workers)
        return discard

    def _begin_order(self, plan: dict[str, Any] | None, skip: int, workers: int, *, hello: bool) -> int:
        order = self.order
        assert order is not None  # _begin_pass calls this only for a sampler's order
        # torch hands batch i of a pass to worker i % workers (in order): the epoch's batch ``skip`` was
        # worker skip % workers's turn, so workers 0 .. that one - 1 each take a pad batch first and every
        # worker goes on from its own state. Out of order, the batches name their number instead.
        in_order = self.in_order or workers == 0
        order.first, order.drop = skip, frozenset(self.handed)
        order.pads = skip % workers if in_order and workers and self.pad_turns else 0
        self.greet = 0
        if hello and in_order and self.pad_turns and is_stateful(self.user_dataset):
            order.pads += workers  # one each: they come back first, as worker i's, i = 0 .. workers - 1
            self.greet = workers
        order.number = not in_order
        saved = plan.get("sampler") if plan is not None else None
        if saved is not None:
            order.restore = saved  # the sampler positions itself
            self.sampler_start = saved
        else:
            order.skip = skip * order.unit
            if skip and not self._replays_exactly():
                log.warning(
                    "coordl: %s defines no state_dict/load_state_dict: resuming fast-forwards it by the %d "
                    "indices already handed out (drawn, not fetched); its order must be the one it had "
                    "when the state was saved", type(order.inner).__name__, order.skip,
                )  # fmt: skip
            at_rest = order.tracks(order.current)
            self.sampler_start = {**order.snapshot(), "drain": order.passes > 0} if at_rest else None
        order.epoch_seed = None
        if self.generator_state is not None:
            digest = hashlib.blake2b(self.generator_state.encode(), digest_size=8).digest()
            order.epoch_seed = int.from_bytes(digest, "little")
        if plan is not None and plan.get("dataset") is not None and is_stateful(self.user_dataset):
            # The main process's dataset, once torch's iterator has drawn its seed and the sampler has
            # been fast-forwarded (torchdata's order: their draws do not move a restored RNG state).
            order.on_start = functools.partial(self.user_dataset.load_state_dict, plan["dataset"])
        return 0

    def _replays_exactly(self) -> bool:
        """Whether skipping the first indices of the sampler's pass gives the saved pass's: its order
        comes from a generator whose state is saved, or is sequential."""
        if (
            self.shuffle_generator is not None
            or self.sampler_generator is not None
            or self.generator is not None
        ):
            return True
        order = self.order
        assert order is not None  # called by _begin_order only
        inner = order.inner
        inner = getattr(inner, "sampler", inner) if order.batched else inner
        return type(inner) is torch.utils.data.SequentialSampler

    def _begin_stream(self, plan: dict[str, Any], skip: int, workers: int) -> int:
        """A stream resumes from its states; without any (nothing Stateful), by replaying ``skip``
        batches from the start (torchdata's fast-forward)."""
        if workers == 0 and plan.get("dataset") is not None:
            if self.stream is None:  # a torch DataPipe, passed to torch as it is: nothing takes the state
                raise StateMismatchError(
                    f"load_state_dict: the state holds a dataset state, but "
                    f"{type(self.user_dataset).__name__} is a DataPipe, which cannot load one"
                )
            self.stream.pending[None] = plan["dataset"]
            return 0
        if workers > 0 and any(
            s.get("dataset") is not None or s.get("iter") is not None for s in self.worker_states.values()
        ):
            return 0
        self.worker_states = {}  # (only ends noted): a stream without state is replayed, all workers anew
        if skip:
            log.warning(
                "coordl: %s defines no state_dict/load_state_dict (nor does its iterator): resuming "
                "replays the first %d batches of the epoch and drops them",
                type(self.user_dataset).__name__, skip,
            )  # fmt: skip
        return skip

    def _worker_plan(self, plan: dict[str, Any] | None, workers: int) -> dict[int, Any]:
        """Worker id -> what that new worker restores; empty when the workers start as constructed."""
        if workers == 0 or (plan is None and not self._restart) or not self.worker_states:
            return {}
        states = self.worker_states
        if self.stream is not None:
            last = self.last_worker if plan is not None and self.batches_done else None
            pads = set(range(last + 1)) if last is not None and last < workers - 1 else set()
            return {i: {**(states.get(i) or {}), "pads": int(i in pads)} for i in range(workers)}
        # each worker its own state (the sampler's pads keep the turns): after its last batch handed
        # out, or the loaded one when it has handed out none since; none: it starts as constructed
        return {i: s for i, s in states.items() if s is not None and i < workers}

    def load_state_dict(self, state: Any, shape: dict[str, Any]) -> None:
        """Check ``state`` against this loader now; the next pass resumes from it."""
        check_state(state, shape)
        decode_runs(state.get("handed_out_after") or [])  # refused now, not at the next iter()
        for key, generator, how in (
            ("generator_state", self.generator, "with generator="),
            ("shuffle_state", self.shuffle_generator, "with shuffle=True and no generator="),
            ("sampler_generator_state", self.sampler_generator, "with a sampler that has its own generator"),
        ):
            saved = state.get(key)
            if (saved is None) != (generator is None):
                raise StateMismatchError(
                    f"load_state_dict: the state was saved by a loader {'not ' if saved is None else ''}built "
                    f"{how}; build this one the same way as the one that saved it"
                )
            if generator is not None:
                generator.set_state(decode_generator_state(saved))
        if state.get("sampler_epoch") is not None and self.order is not None:
            self.order.set_epoch(int(state["sampler_epoch"]))
        if self.in_epoch:  # a pass is running: its iterator no longer moves this state
            self.pass_id += 1
            self.in_epoch = False
        self.epoch = int(state["epoch"])
        self._restart = True
        self.pinned_rng = None
        self.plan = dict(state)  # copied when the next pass applies it

"""Resumable loader state: stop anywhere in an epoch, continue in a new process with exactly the batches
that had not been returned, in the same order.

The order of an epoch is a function of the state of the generator that shuffles it (``generator=`` of
the loader) when the epoch starts: torch draws the workers' base seed and then the permutation from it.
So the state is small: that generator state, the epoch, and how many batches the user got. Resuming
restores the generator state and skips the batches already returned *in the sampler*, so they are never
fetched or prepped again; batches that were prefetched but not returned are made again.

Random augmentation: with a generator, each item's prep runs with torch's RNG seeded from (epoch
seed, item index) (:class:`SeededIndex`), so an item's augmentation does not depend on which worker
prepped it or where the epoch was interrupted. Without a generator, torch's own per-worker seeding
applies unchanged (and a shuffled order cannot be resumed exactly: :func:`check_resumable` says so).

A job of a coordination group (``coordinate=``) saves its group epoch and the batches it got; resumed,
it rejoins the group at that position when the group is still at that epoch, else it makes the rest of
that epoch's batches itself (in its own process, from the group's order for that epoch) and then
follows the group from wherever the group is: its later epochs are the group's, not those an
uninterrupted run would have seen.

Limits, by construction: persistent workers and a user ``worker_init_fn`` that draws its own random
state are outside what the state can restore; ``len(iter(loader))`` of a resumed epoch is the full
epoch's length, while it yields only the batches that were left.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = [
    "STATE_FORMAT",
    "STATE_VERSION",
    "Resume",
    "ResumableSampler",
    "SeededIndex",
    "check_state",
    "group_state",
    "load_group_state",
    "decode_generator_state",
    "encode_generator_state",
    "item_seed",
]

STATE_FORMAT = "coordl.DataLoader.state"
STATE_VERSION = 1


class SeededIndex(int):
    """An item index that carries the seed its prep's random draws start from (pickles as an int does)."""

    seed: int

    def __new__(cls, index: int, seed: int) -> SeededIndex:
        obj = super().__new__(cls, index)
        obj.seed = seed
        return obj

    def __reduce__(self) -> tuple:
        return (SeededIndex, (int(self), self.seed))


def item_seed(epoch_seed: int, index: int) -> int:
    """A 63-bit seed for item ``index`` in the epoch whose seed is ``epoch_seed``."""
    digest = hashlib.blake2b(f"{epoch_seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def encode_generator_state(generator: torch.Generator) -> str:
    return base64.b64encode(generator.get_state().numpy().tobytes()).decode()


def decode_generator_state(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


class ResumableSampler:
    """Wraps a sampler (or a batch sampler): can skip the first items (or batches) of its next pass, and
    tags each index with its prep seed when an epoch seed is set.

    Args:
        inner: the sampler torch would have used (``RandomSampler``, ``SequentialSampler``, the user's,
            or :class:`coordl.partitioned.ownership.PartitionedSampler`), or a batch sampler.
        batched: ``inner`` yields lists of indices (a batch sampler).
    """

    def __init__(self, inner: Any, *, batched: bool = False) -> None:
        self.inner = inner
        self.batched = batched
        self.skip = 0  # items (batches when batched) of the next pass not to yield
        self.epoch_seed: int | None = None
        self.inner_epoch: int | None = None  # the inner sampler's epoch in the pass now running

    def __iter__(self) -> Iterator[Any]:
        skip, self.skip = self.skip, 0
        it = iter(self.inner)
        self.inner_epoch = getattr(self.inner, "epoch", None)
        seed = self.epoch_seed
        for n, item in enumerate(it):
            if n < skip:
                continue
            if seed is None:
                yield item
            elif self.batched:
                yield [SeededIndex(int(i), item_seed(seed, int(i))) for i in item]
            else:
                yield SeededIndex(int(item), item_seed(seed, int(item)))

    def __len__(self) -> int:
        return len(self.inner)

    def set_epoch(self, epoch: int) -> None:
        """Passed on to the inner sampler (``DistributedSampler``-style samplers need it each epoch)."""
        if hasattr(self.inner, "set_epoch"):
            self.inner.set_epoch(epoch)

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("inner")
        if inner is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(inner, name)


def check_state(state: Any, expected: dict[str, Any]) -> None:
    """Refuse a state of another format, version or loader shape, naming the key at fault."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise ValueError(
            f"load_state_dict: not a coordl.DataLoader state (expected format {STATE_FORMAT!r}, got "
            f"{state.get('format') if isinstance(state, dict) else type(state).__name__!r})"
        )
    version = state.get("version")
    if version != STATE_VERSION:
        raise ValueError(
            f"load_state_dict: state version {version!r} is not this coordl's ({STATE_VERSION}); it was "
            f"saved by {'a newer' if isinstance(version, int) and version > STATE_VERSION else 'another'} "
            "version of coordl: resume with that version, or start the epoch afresh"
        )
    for key, value in expected.items():
        if state.get(key) != value:
            raise ValueError(
                f"load_state_dict: the state has {key}={state.get(key)!r} but this loader has {key}={value!r}: "
                "build the loader with the same arguments as the one that saved it"
            )


class Resume:
    """The order of a loader's epochs, kept resumable: the sampler handed to torch and the progress.

    Args:
        dataset: the dataset torch iterates (for the default samplers).
        sampler, batch_sampler, shuffle, batch_size, generator: the loader's arguments (``sampler``
            already replaced by the partitioned sampler where that applies).
    """

    def __init__(
        self,
        dataset: Any,
        *,
        sampler: Any,
        batch_sampler: Any,
        shuffle: bool | None,
        batch_size: int | None,
        generator: torch.Generator | None,
    ) -> None:
        self.generator = generator
        self._shuffle = shuffle
        self._pass_through_sampler = sampler if batch_sampler is not None else None
        if batch_sampler is not None:
            self.order = ResumableSampler(batch_sampler, batched=True)
            self._skip_unit = 1
        else:
            if sampler is None:  # what torch would make, so the order is torch's for the same generator
                sampler = (
                    torch.utils.data.RandomSampler(dataset, generator=generator)
                    if shuffle
                    else torch.utils.data.SequentialSampler(dataset)
                )
            self.order = ResumableSampler(sampler)
            self._skip_unit = batch_size or 1  # items per batch: the wrapped sampler yields items
        self.epoch = 0  # the epoch running, or the next one between epochs
        self.batches_done = 0
        self.in_epoch = False
        self.generator_state: str | None = None
        self._pending: int | None = None  # batches to skip at the next pass (a resume)

    def torch_arguments(self) -> tuple[Any, Any, bool | None]:
        """``(sampler, batch_sampler, shuffle)`` to build torch's loader with."""
        if self.order.batched:
            return self._pass_through_sampler, self.order, self._shuffle
        return self.order, None, None

    # -- the passes ----------------------------------------------------------------------------------

    def begin_epoch(self) -> None:
        """A pass starts (``iter``): note the generator's state, arm the skip of a pending resume."""
        if self.in_epoch:  # the previous pass was left early: this is the next epoch
            self.epoch += 1
        self.in_epoch = True
        self.generator_state = encode_generator_state(self.generator) if self.generator is not None else None
        skip, self._pending = self._pending or 0, None
        self.batches_done = skip
        self.order.skip = skip * self._skip_unit
        self.order.epoch_seed = None
        if self.generator_state is not None:
            digest = hashlib.blake2b(self.generator_state.encode(), digest_size=8).digest()
            self.order.epoch_seed = int.from_bytes(digest, "little")

    def returned(self) -> None:
        """The user got one more batch of this pass."""
        self.batches_done += 1

    def finished(self) -> None:
        self.in_epoch = False
        self.epoch += 1
        self.batches_done = 0

    # -- state ----------------------------------------------------------------------------------------

    def state_dict(self, shape: dict[str, Any]) -> dict[str, Any]:
        """The JSON-serialisable state; ``shape`` is what a loader resuming it must agree on."""
        between = not self.in_epoch
        now = encode_generator_state(self.generator) if self.generator is not None else None
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            **shape,
            "epoch": self.epoch,
            "batches_done": 0 if between else self.batches_done,
            "generator_state": now if between else self.generator_state,
            "sampler_epoch": None if between else self.order.inner_epoch,
        }

    def load_state_dict(self, state: Any, shape: dict[str, Any]) -> None:
        """Restore ``state``: the next pass yields the batches that were not returned."""
        check_state(state, shape)
        saved = state.get("generator_state")
        if (saved is None) != (self.generator is None):
            raise ValueError(
                "load_state_dict: the state was saved by a loader "
                + ("without" if saved is None else "with")
                + " generator=; build this one the same way (generator=torch.Generator().manual_seed(s))"
            )
        inner = self.order.inner
        if self.generator is not None:
            self.generator.set_state(decode_generator_state(saved))
        elif isinstance(inner, torch.utils.data.RandomSampler) and state["batches_done"]:
            raise ValueError(
                "load_state_dict: a shuffled epoch resumes exactly only with generator=: build the loader "
                "with generator=torch.Generator().manual_seed(s)"
            )
        if state.get("sampler_epoch") is not None:
            self.order.set_epoch(int(state["sampler_epoch"]))
        self.epoch, self.in_epoch, self._pending = int(state["epoch"]), False, int(state["batches_done"])


def group_state(member: Any, shape: dict[str, Any]) -> dict[str, Any]:
    """The state of a job of a coordination group: its group epoch and the batches it got of it."""
    epoch, done = member.position()
    return {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        **shape,
        "coordinate": member.group.name,
        "group_epoch": epoch,
        "batches_done": done,
    }


def load_group_state(member: Any, state: Any, shape: dict[str, Any]) -> None:
    """Resume a coordinated job: with the group at the saved position, or alone for the rest of the
    saved epoch when the group has moved on (:meth:`coordl.coordinated.job.GroupMember.resume_at`)."""
    check_state(state, {**shape, "coordinate": member.group.name})
    member.resume_at(int(state["group_epoch"]), int(state["batches_done"]))

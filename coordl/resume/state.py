"""The saved state as plain data: its format, the checks on load, and the encodings it uses.

A state is a dict of JSON types (the user's own ``state_dict()`` values are kept as they return them,
so the whole state is JSON-serialisable when theirs are). Generator and RNG states are base64 text.
"""

from __future__ import annotations

import base64
from typing import Any, Protocol, TypeGuard

import torch

__all__ = [
    "STATE_FORMAT",
    "STATE_VERSION",
    "StateMismatchError",
    "check_state",
    "decode_generator_state",
    "decode_runs",
    "encode_generator_state",
    "encode_rng_state",
    "encode_runs",
    "group_state",
    "is_stateful",
    "load_group_state",
    "torch_generator",
]

STATE_FORMAT = "coordl.DataLoader.state"
# 2: the Stateful protocol (sampler, dataset and per-worker states), shuffling without generator=,
# IterableDatasets; a version-1 state is refused with a clear error.
STATE_VERSION = 2


class StateMismatchError(ValueError, AssertionError):
    """A state that does not fit the loader loading it (another shape, format or version).

    A ValueError, and an AssertionError too: torchdata's ``StatefulDataLoader`` refuses another
    ``num_workers`` with an ``assert``, so code written for it catches that.
    """


class Stateful(Protocol):
    """torchdata's Stateful protocol: what :func:`is_stateful` checks for."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


def is_stateful(obj: Any) -> TypeGuard[Stateful]:
    """Whether ``obj`` follows the Stateful protocol (torchdata's meaning: it has both methods)."""
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def encode_rng_state(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode()


def encode_generator_state(generator: torch.Generator) -> str:
    return encode_rng_state(generator.get_state())


def decode_generator_state(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def encode_runs(numbers: set[int]) -> list[list[int]]:
    """``numbers`` as sorted runs ``[first, last]`` of consecutive numbers."""
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return runs


def decode_runs(runs: list[Any]) -> set[int]:
    """The numbers of :func:`encode_runs`'s runs (a run that is not two ascending ints is refused)."""
    numbers: set[int] = set()
    for run in runs:
        if not (isinstance(run, (list, tuple)) and len(run) == 2 and all(isinstance(n, int) for n in run)):
            raise StateMismatchError(
                f"load_state_dict: handed_out_after holds {run!r}, not a run [first, last]"
            )
        numbers.update(range(int(run[0]), int(run[1]) + 1))
    return numbers


def torch_generator(text: str) -> torch.Generator:
    """A CPU generator in the state ``text`` (from :func:`encode_generator_state` or ``encode_rng_state``)."""
    generator = torch.Generator()
    generator.set_state(decode_generator_state(text))
    return generator


def check_state(state: Any, expected: dict[str, Any]) -> None:
    """Refuse a state of another format, version or loader shape, naming the key and both values."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise StateMismatchError(
            f"load_state_dict: not a coordl.DataLoader state (expected format {STATE_FORMAT!r}, got "
            f"{state.get('format') if isinstance(state, dict) else type(state).__name__!r})"
        )
    version = state.get("version")
    if version != STATE_VERSION:
        raise StateMismatchError(
            f"load_state_dict: state version {version!r} is not this coordl's ({STATE_VERSION}); it was "
            f"saved by {'a newer' if isinstance(version, int) and version > STATE_VERSION else 'another'} "
            "version of coordl: resume with that version, or start the epoch afresh"
        )
    for key, value in expected.items():
        if state.get(key) != value:
            raise StateMismatchError(
                f"load_state_dict: the state has {key}={state.get(key)!r} but this loader has {key}={value!r}: "
                "build the loader with the same arguments as the one that saved it"
            )


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

"""Compact batches over the network: an actor sends uint8 crops back, the trainer finishes them.

The standard recipe ends in ``ToTensor`` + ``Normalize``: deterministic, 0.02 ms a sample, and 4x the
bytes of their uint8 input (602 KB of float32 for a 224x224 crop against 150 KB). Sending the float
tensors back cost the remote path most of what it gained (reports/bench_remote_prep.md: Ray's transfer
and the trainer's copy of 19 MB per batch of 32). So when the source's transform is a coordl
:class:`~coordl.prep.transforms.Compose` with such a tail (:meth:`~coordl.prep.transforms.Compose.split_tail`),
the actor runs a copy of the source whose transform stops before the tail and marks its output
(:class:`Compact`); it sends the samples uncollated, and the trainer runs the tail on each marked array
(:func:`finish`), then the loader's collate. Every random draw happens on the actor, as before; the tail
is a pure function of the array, so the batch is the one the local path makes, bit for bit.

A source without such a transform (a user's own ``prep``) is sent as it is and its batches come back
collated.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

from coordl.prep.transforms import Compose

__all__ = ["Compact", "compact_source", "finish", "finish_all", "wire_bytes"]


class Compact:
    """A head's output on its way back: the array the trainer's tail finishes."""

    __slots__ = ("array",)

    def __init__(self, array: Any) -> None:
        self.array = array

    def __reduce__(self) -> tuple:
        return (Compact, (self.array,))


class _MarkedHead:
    """The transform an actor's copy of the source runs: the head, its output marked :class:`Compact`."""

    def __init__(self, head: Compose) -> None:
        self.head = head
        self.reads_buffers = head.reads_buffers  # the source asks its transform whether views are fine

    def __call__(self, x: Any) -> Compact:
        return Compact(self.head(x))

    def __repr__(self) -> str:
        return f"Compact({self.head!r})"


def compact_source(source: Any) -> tuple[Any, Compose] | None:
    """``(a copy of source for the actors, the tail the trainer runs)``, or None when the source's
    ``transform`` is not a coordl ``Compose`` with a deterministic tensor tail after a non-empty head."""
    transform = getattr(source, "transform", None)
    if not isinstance(transform, Compose):
        return None
    head, tail = transform.split_tail()
    if not len(head) or not len(tail):
        return None
    remote = copy.copy(source)
    try:
        remote.transform = _MarkedHead(head)
    except AttributeError:  # a read-only transform: the source is sent as it is
        return None
    return remote, tail


def finish_all(samples: list[Any], tail: Callable[[Any], Any]) -> list[Any]:
    """Each sample :func:`finish`-ed. Ray hands arrays back as read-only views of its object store;
    the tail only reads its input (into a new output), so torch's warning on wrapping a read-only
    array is silenced here rather than paid for with a copy."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return [finish(s, tail) for s in samples]


def finish(sample: Any, tail: Callable[[Any], Any]) -> Any:
    """``sample`` with each :class:`Compact` leaf (in tuples, lists and dicts) run through ``tail``."""
    if isinstance(sample, Compact):
        return tail(sample.array)
    if type(sample) in (list, tuple):
        return type(sample)(finish(s, tail) for s in sample)
    if type(sample) is dict:
        return {k: finish(v, tail) for k, v in sample.items()}
    return sample


def wire_bytes(sample: Any) -> int:
    """Bytes of the arrays in ``sample`` as it came over the network (Compact leaves included)."""
    if isinstance(sample, Compact):
        return int(sample.array.nbytes)
    if isinstance(getattr(sample, "nbytes", None), int):
        return int(sample.nbytes)
    if isinstance(sample, (list, tuple)):
        return sum(wire_bytes(s) for s in sample)
    if isinstance(sample, dict):
        return sum(wire_bytes(v) for v in sample.values())
    return 0

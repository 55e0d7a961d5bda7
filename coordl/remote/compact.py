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

import contextlib
import copy
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import default_collate

from coordl.prep.transforms import Compose
from coordl.ring.output_buffers import lend

__all__ = ["Compact", "collate_finished", "compact_source", "finish", "finish_all", "wire_bytes"]


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


@contextlib.contextmanager
def _read_only_arrays() -> Iterator[None]:
    """Ray hands arrays back as read-only views of its object store; the tail only reads its input
    (into a new output), so torch's warning on wrapping a read-only array is silenced rather than
    paid for with a copy."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        yield


def finish_all(samples: list[Any], tail: Callable[[Any], Any]) -> list[Any]:
    """Each sample :func:`finish`-ed."""
    with _read_only_arrays():
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


def collate_finished(
    samples: list[Any], tail: Callable[[Any], Any], collate_fn: Callable[[list[Any]], Any]
) -> Any:
    """The batch of ``samples`` finished (:func:`finish`) and collated by ``collate_fn``.

    With torch's ``default_collate`` (the loader's default), each sample's tail writes its output
    straight into its row of the batch tensor (:func:`coordl.ring.output_buffers.lend`), as a local
    worker's batch ring does: the stack's copy of the whole batch (19 MB for 32 crops of 224 px, 8 ms
    here) is not made. Anything else (a user's collate, samples of other shapes) finishes each sample
    and calls ``collate_fn``.
    """
    if collate_fn is default_collate and samples:
        with _read_only_arrays():
            batch = _stacked(samples, tail)
        if batch is not None:
            return batch
    return collate_fn(finish_all(samples, tail))


def _paths(sample: Any, path: tuple = ()) -> list[tuple]:
    """Where the :class:`Compact` leaves of ``sample`` are (keys into plain tuples, lists and dicts)."""
    if isinstance(sample, Compact):
        return [path]
    if type(sample) in (list, tuple):
        return [p for n, s in enumerate(sample) for p in _paths(s, (*path, n))]
    if type(sample) is dict:
        return [p for k, v in sample.items() for p in _paths(v, (*path, k))]
    return []


def _at(sample: Any, path: tuple) -> Any:
    for key in path:
        sample = sample[key]
    return sample


def _stripped(sample: Any) -> Any:
    """``sample`` with each Compact leaf as 0 (collated apart, then put in its place)."""
    if isinstance(sample, Compact):
        return 0
    if type(sample) in (list, tuple):
        return type(sample)(_stripped(s) for s in sample)
    if type(sample) is dict:
        return {k: _stripped(v) for k, v in sample.items()}
    return sample


def _stacked(samples: list[Any], tail: Callable[[Any], Any]) -> Any:
    """``default_collate`` of the finished samples, each Compact position finished into its batch tensor
    row by row; None when the samples do not allow it (then the caller collates as usual)."""
    paths = _paths(samples[0])
    if not paths:
        return None
    n = len(samples)
    stacks: dict[tuple, torch.Tensor] = {}
    for path in paths:
        out: torch.Tensor | None = None
        for i, sample in enumerate(samples):
            try:
                leaf = _at(sample, path)
            except (IndexError, KeyError, TypeError):
                return None
            if not isinstance(leaf, Compact):
                return None

            def take(shape: tuple[int, ...], dtype: torch.dtype, i: int = i) -> torch.Tensor | None:
                nonlocal out
                if out is None:
                    out = torch.empty((n, *shape), dtype=dtype)
                return out[i] if (out.shape[1:], out.dtype) == (shape, dtype) else None

            with lend(take):
                value = tail(leaf.array)
            if not isinstance(value, torch.Tensor) or out is None or value.shape != out.shape[1:]:
                return None
            if value.dtype != out.dtype:
                return None
            if value.data_ptr() != out[i].data_ptr():  # the tail made a tensor of its own: copy it in
                out[i].copy_(value)
        assert out is not None
        stacks[path] = out
    batch = default_collate([_stripped(s) for s in samples])
    for path, stack in stacks.items():
        *parents, last = path
        holder = _at(batch, tuple(parents))
        if type(holder) not in (list, dict):  # default_collate gives lists for tuples; anything else
            return None
        holder[last] = stack
    return batch

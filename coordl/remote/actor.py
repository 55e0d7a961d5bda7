"""What runs on a remote CPU: a Ray actor holding the dataset, prepping batches of item indices.

:func:`prep_batch` is the prep of one batch, the same code on a remote actor and in the trainer when a
batch lost with its node is prepped again: per item, its raw bytes (read here, or sent by the trainer),
torch's CPU generator seeded with the item's seed when the epoch carries one (as
:class:`coordl.fetch.pipeline.LoaderSource` seeds it in a local worker), ``source.prep``; then the
loader's collate. So an item's random draws do not depend on where it was prepped.
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

import torch

from coordl.errors import CorruptItemError

__all__ = ["PrepActor", "as_arrays", "as_tensors", "prep_batch", "raw_digest"]


def prep_batch(
    source: Any,
    indices: Sequence[int],
    seeds: Sequence[int | None],
    raws: Sequence[bytes] | None,
    fetch: Callable[[int], bytes],
    collate_fn: Callable[[list[Any]], Any] | None,
) -> tuple[Any, int]:
    """``(collated batch, bytes read here)`` for ``indices``; ``raws`` (or ``fetch``) gives the raw bytes.
    Without ``collate_fn``, the list of samples (compact samples the trainer finishes and collates:
    :mod:`coordl.remote.compact`).

    An item's error is raised as it is (a :class:`CorruptItemError` names its file and item); any other
    error gets a note naming the item, as local workers' errors name the worker.
    """
    samples, read = [], 0
    for n, (index, seed) in enumerate(zip(indices, seeds, strict=True)):
        try:
            if raws is not None:
                raw = raws[n]
            else:
                raw = fetch(index)
                read += len(raw)
            if seed is not None:
                # the CPU generator only, as BatchLoads.seed does (the same draws)
                torch.default_generator.manual_seed(seed)
            samples.append(source.prep(raw, index))
        except CorruptItemError:
            raise
        except Exception as error:
            note = f"coordl remote prep: raised by item {index} on {socket.gethostname()}"
            if hasattr(error, "add_note"):  # Python 3.11+; on 3.10 the error goes as it is
                error.add_note(note)
            raise
    return (samples if collate_fn is None else collate_fn(samples)), read


def raw_digest(raw: bytes) -> str:
    """A short digest of an item's raw bytes: the trainer and an actor compare their reads with it."""
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


class PrepActor:
    """One remote CPU's prep (made a Ray actor by :mod:`coordl.remote.dispatch`).

    Args:
        source: the loader's item source (``fetch`` and ``prep``), shipped once by Ray.
        collate_fn: the loader's collate (the user's, or torch's default); None: the samples are sent
            back uncollated (compact samples, finished and collated by the trainer).
    """

    def __init__(self, source: Any, collate_fn: Callable[[list[Any]], Any] | None) -> None:
        torch.set_num_threads(1)  # one CPU per actor, as torch sets in each of its loader workers
        self.source = source
        self.collate_fn = collate_fn

    def probe(self, index: int) -> dict[str, Any]:
        """Where this actor runs, and the digest of its own read of ``index`` (None: it cannot read it)."""
        try:
            digest: str | None = raw_digest(self.source.fetch(index))
            why = ""
        except Exception as error:  # any failure means: send this actor the bytes
            digest, why = None, f"{type(error).__name__}: {error}"
        return {"host": socket.gethostname(), "pid": os.getpid(), "digest": digest, "why": why}

    def prep(self, indices: list[int], seeds: list[int | None], raws: list[bytes] | None) -> tuple[Any, int]:
        """The collated batch of ``indices`` (its tensors as NumPy arrays) and the bytes read for it."""
        batch, read = prep_batch(self.source, indices, seeds, raws, self.source.fetch, self.collate_fn)
        return as_arrays(batch), read


def as_arrays(batch: Any) -> Any:
    """``batch`` with its CPU tensors as NumPy arrays (in lists, tuples and dicts): Ray moves arrays as
    raw buffers into its object store, where a tensor is pickled through its storage."""
    if isinstance(batch, torch.Tensor) and batch.device.type == "cpu" and not batch.requires_grad:
        return _Array(batch.numpy())
    if isinstance(batch, (list, tuple)) and type(batch) in (list, tuple):
        return type(batch)(as_arrays(b) for b in batch)
    if type(batch) is dict:
        return {k: as_arrays(v) for k, v in batch.items()}
    return batch


def as_tensors(batch: Any) -> Any:
    """The inverse of :func:`as_arrays`, in the trainer: each array copied out of Ray's read-only
    object store into a tensor of the trainer's own (the user may write to it)."""
    if isinstance(batch, _Array):
        return torch.from_numpy(batch.array.copy())
    if isinstance(batch, (list, tuple)) and type(batch) in (list, tuple):
        return type(batch)(as_tensors(b) for b in batch)
    if type(batch) is dict:
        return {k: as_tensors(v) for k, v in batch.items()}
    return batch


class _Array:
    """A tensor's array on its way back (a user's own NumPy arrays in a batch stay arrays)."""

    __slots__ = ("array",)

    def __init__(self, array: Any) -> None:
        self.array = array

    def __reduce__(self) -> tuple:
        return (_Array, (self.array,))

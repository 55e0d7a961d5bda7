"""The structure of a sample, for collating batches into preallocated memory.

A *spec* is a nested tuple describing one sample: stacked leaves (tensors and arrays, which go into a
batch slot), scalar leaves (numbers and strings, collated by the main process) and the containers
around them. Two samples with the same spec and leaf layouts can be stacked row by row.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

__all__ = ["ALIGN", "align", "build", "flatten", "gather", "has_ring_leaf", "leaf_layout", "spec_of"]

ALIGN = 64  # leaves start on a cache line

# Spec node kinds: a stacked leaf in the slot, a small leaf collated by the main process, containers.
RING, SCALAR, TUPLE, LIST, DICT = range(5)
SCALAR_TYPES = (int, float, bool, str, bytes)
_TENSOR_DTYPES = frozenset(
    {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8, torch.int16,
     torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128}
)  # fmt: skip
_NUMPY_DTYPES = {
    np.dtype(n): getattr(torch, t)
    for n, t in [("float32", "float32"), ("float64", "float64"), ("float16", "float16"), ("uint8", "uint8"),
                 ("int8", "int8"), ("int16", "int16"), ("int32", "int32"), ("int64", "int64"),
                 ("bool", "bool"), ("complex64", "complex64"), ("complex128", "complex128")]
}  # fmt: skip


def align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


# -- the structure of a sample ---------------------------------------------------------------------


def spec_of(obj: Any) -> tuple | None:
    """The structure of one sample, or None when the ring cannot hold it (default_collate decides)."""
    t = type(obj)
    if t is torch.Tensor or t is np.ndarray:
        return (RING,)
    if t in SCALAR_TYPES or isinstance(obj, (np.number, np.bool_)):
        return (SCALAR,)
    if t is tuple or t is list:
        children = tuple(spec_of(x) for x in obj)
        return None if None in children else (TUPLE if t is tuple else LIST, children)
    if t is dict:
        children = tuple(spec_of(v) for v in obj.values())
        return None if None in children else (DICT, tuple(obj), children)
    return None


def has_ring_leaf(spec: tuple) -> bool:
    if spec[0] == RING:
        return True
    return spec[0] != SCALAR and any(has_ring_leaf(c) for c in spec[-1])


def gather(spec: tuple, samples: list, rings: list[list], scalars: list[list]) -> bool:
    """Transpose ``samples`` along ``spec`` into per-leaf lists; False if any sample differs."""
    kind = spec[0]
    if kind in (RING, SCALAR):
        first = type(samples[0])
        if any(type(s) is not first for s in samples):
            return False
        (rings if kind == RING else scalars).append(samples)
        return True
    if kind == DICT:
        keys = spec[1]
        if any(type(s) is not dict or len(s) != len(keys) for s in samples) or tuple(samples[0]) != keys:
            return False  # default_collate orders keys as the batch's first sample does
        try:
            return all(
                gather(child, [s[k] for s in samples], rings, scalars)
                for k, child in zip(keys, spec[2], strict=True)
            )
        except KeyError:
            return False
    want = tuple if kind == TUPLE else list
    children = spec[1]
    if any(type(s) is not want or len(s) != len(children) for s in samples):
        return False
    return all(gather(child, [s[i] for s in samples], rings, scalars) for i, child in enumerate(children))


def flatten(spec: tuple, sample: Any, rings: list, scalars: list) -> bool:
    """:func:`gather` for one sample: its leaves appended in spec order; False if it differs from ``spec``.

    The per-sample path of the ring's stacker (``gather`` transposes whole batches)."""
    kind = spec[0]
    if kind == RING:
        rings.append(sample)
        return True
    if kind == SCALAR:
        scalars.append(sample)
        return True
    if kind == DICT:
        keys = spec[1]
        if type(sample) is not dict or len(sample) != len(keys) or tuple(sample) != keys:
            return False
        return all(flatten(child, sample[k], rings, scalars) for k, child in zip(keys, spec[2], strict=True))
    children = spec[1]
    if type(sample) is not (tuple if kind == TUPLE else list) or len(sample) != len(children):
        return False
    for child, x in zip(children, sample, strict=True):
        leaf = child[0]
        if leaf == RING:  # leaves inline: (input, target) is the usual sample, flattened per sample
            rings.append(x)
        elif leaf == SCALAR:
            scalars.append(x)
        elif not flatten(child, x, rings, scalars):
            return False
    return True


def leaf_layout(values: list) -> tuple[torch.dtype, tuple[int, ...], int] | None:
    """(torch dtype, sample shape, bytes per sample) of a ring leaf, or None if it cannot be stacked."""
    first = values[0]
    if type(first) is torch.Tensor:
        if (
            first.dtype not in _TENSOR_DTYPES
            or first.layout != torch.strided
            or first.device.type != "cpu"
            or first.requires_grad  # default_collate refuses these with its own error
            or first.is_nested
        ):
            return None
        shape, dtype = first.shape, first.dtype
        if any(v.shape != shape or v.dtype != dtype or v.requires_grad for v in values):
            return None
        return dtype, tuple(shape), first.numel() * first.element_size()
    np_dtype = _NUMPY_DTYPES.get(first.dtype)
    if np_dtype is None:
        return None
    if any(v.shape != first.shape or v.dtype != first.dtype for v in values):
        return None
    return np_dtype, first.shape, first.nbytes


def build(spec: tuple, tensors: Iterator, scalars: Iterator) -> Any:
    """The batch default_collate would have made: tuples and lists become lists, dicts stay dicts."""
    kind = spec[0]
    if kind == RING:
        return next(tensors)
    if kind == SCALAR:
        return next(scalars)
    if kind == DICT:
        return {k: build(child, tensors, scalars) for k, child in zip(spec[1], spec[2], strict=True)}
    return [build(child, tensors, scalars) for child in spec[1]]

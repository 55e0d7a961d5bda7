"""Collated batches in shared memory: the project's one codec (:mod:`shmem.codec`) for torch trees.

Coordinated prep hands batches from one job to another through shared memory; the receiving job must
not run code chosen by the sender, so a batch is never pickled. A batch is a tree of tensors and
numbers (tuple, list or dict with string keys, nested); tensors become NumPy leaves of a
``shmem.codec`` frame (bfloat16, which NumPy lacks, travels as its 16-bit patterns under a marker key).

The payload is written without its CRC and read without checking it: a slot is published (state READY,
under the group's lock) only after it is written whole, and a batch is tens of MB, so a CRC would cost
every job tens of ms per batch. The frame's header, its CRC and every offset are still checked.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from shmem import codec as frame

__all__ = ["encode_into", "decode", "encoded_size", "BatchCodecError"]

_BF16 = "__coordl_bfloat16__"  # marker key of a bfloat16 tensor's bits
_DTYPES = {
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8, torch.int16,
    torch.int32, torch.int64, torch.bool,
}  # fmt: skip


class BatchCodecError(ValueError):
    """A batch cannot be encoded (unsupported element) or bytes are not a valid encoded batch."""


def _to_tree(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        if obj.dtype not in _DTYPES:
            raise BatchCodecError(f"unsupported tensor dtype {obj.dtype} in batch")
        t = obj.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            return {_BF16: t.view(torch.int16).numpy()}
        return t.numpy()
    if isinstance(obj, (bool, int, float)):
        return obj
    if isinstance(obj, (tuple, list)):
        items = [_to_tree(x) for x in obj]
        return tuple(items) if isinstance(obj, tuple) else items
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise BatchCodecError("batch dicts must have string keys to be shared between jobs")
        return {k: _to_tree(v) for k, v in obj.items()}
    raise BatchCodecError(
        f"cannot share a batch element of type {type(obj).__name__} between jobs: batches must be "
        "tensors, numbers, or tuples/lists/dicts of them (use a collate_fn that returns tensors)"
    )


def _from_tree(node: Any) -> Any:
    if isinstance(node, np.ndarray):
        return torch.from_numpy(node)  # decoded with copy=True: the array owns its memory
    if isinstance(node, dict):
        if set(node) == {_BF16}:
            return torch.from_numpy(node[_BF16]).view(torch.bfloat16)
        return {k: _from_tree(v) for k, v in node.items()}
    if isinstance(node, tuple):
        return tuple(_from_tree(x) for x in node)
    if isinstance(node, list):
        return [_from_tree(x) for x in node]
    if isinstance(node, (bool, int, float)):
        return node
    raise BatchCodecError(f"an encoded batch holds a {type(node).__name__}, which no batch has")


def encoded_size(batch: Any) -> int:
    """Bytes :func:`encode_into` needs for ``batch``."""
    return frame.encoded_size(_to_tree(batch))


def encode_into(batch: Any, buf: memoryview) -> int:
    """Write ``batch`` into ``buf``; returns the bytes used. Raises BatchCodecError if it does not fit."""
    tree = _to_tree(batch)
    need = frame.encoded_size(tree)
    if need > len(buf):
        raise BatchCodecError(f"encoded batch needs {need} bytes, staging slot has {len(buf)}")
    return frame.encode_into(buf, tree, checksum=False)


def decode(buf: memoryview) -> Any:
    """Rebuild a batch from bytes written by :func:`encode_into` (copies out of ``buf``)."""
    try:
        tree = frame.decode(buf, copy=True, verify_payload=False, max_payload=len(buf))
    except frame.CodecError as e:
        raise BatchCodecError(f"bytes are not an encoded coordl batch: {e}") from None
    return _from_tree(tree)

"""Collated batches as raw bytes plus a small parsed header (never pickle).

Coordinated prep hands batches from one job to another through shared memory; the receiving job
must not run code chosen by the sender, so a batch is a tree of tensors (tuple, list or dict with
string keys, nested) encoded as: a JSON structure header that names each tensor's dtype and shape,
then the tensors' bytes back to back, each 64-byte aligned.

Layout: ``b"CDLB" | u32 header_len | header (JSON, utf-8) | pad | tensor bytes...``
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import torch

__all__ = ["encode_into", "decode", "encoded_size", "BatchCodecError"]

_MAGIC = b"CDLB"
_PREFIX = struct.Struct("<4sI")
_ALIGN = 64
_DTYPES = {
    torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
    torch.bfloat16: "bfloat16", torch.uint8: "uint8", torch.int8: "int8", torch.int16: "int16",
    torch.int32: "int32", torch.int64: "int64", torch.bool: "bool",
}  # fmt: skip
_FROM_NAME = {v: k for k, v in _DTYPES.items()}


class BatchCodecError(ValueError):
    """A batch cannot be encoded (unsupported element) or bytes are not a valid encoded batch."""


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _structure(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        if obj.dtype not in _DTYPES:
            raise BatchCodecError(f"unsupported tensor dtype {obj.dtype} in batch")
        tensors.append(obj.detach().cpu().contiguous())
        return {"t": len(tensors) - 1, "dtype": _DTYPES[obj.dtype], "shape": list(obj.shape)}
    if isinstance(obj, (int, float, bool)):
        return {"v": obj}
    if isinstance(obj, (tuple, list)):
        return {"seq": [_structure(x, tensors) for x in obj], "tuple": isinstance(obj, tuple)}
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise BatchCodecError("batch dicts must have string keys to be shared between jobs")
        return {"map": {k: _structure(v, tensors) for k, v in obj.items()}}
    raise BatchCodecError(
        f"cannot share a batch element of type {type(obj).__name__} between jobs: batches must be "
        "tensors, numbers, or tuples/lists/dicts of them (use a collate_fn that returns tensors)"
    )


def _plan(batch: Any) -> tuple[bytes, list[torch.Tensor], list[int], int]:
    tensors: list[torch.Tensor] = []
    header = json.dumps(_structure(batch, tensors), separators=(",", ":")).encode()
    offset = _align(_PREFIX.size + len(header))
    offsets = []
    for t in tensors:
        offsets.append(offset)
        offset = _align(offset + t.numel() * t.element_size())
    return header, tensors, offsets, offset


def encoded_size(batch: Any) -> int:
    """Bytes :func:`encode_into` needs for ``batch``."""
    return _plan(batch)[3]


def encode_into(batch: Any, buf: memoryview) -> int:
    """Write ``batch`` into ``buf``; returns the bytes used. Raises BatchCodecError if it does not fit."""
    header, tensors, offsets, total = _plan(batch)
    if total > len(buf):
        raise BatchCodecError(f"encoded batch needs {total} bytes, staging slot has {len(buf)}")
    _PREFIX.pack_into(buf, 0, _MAGIC, len(header))
    buf[_PREFIX.size : _PREFIX.size + len(header)] = header
    for t, off in zip(tensors, offsets, strict=True):
        n = t.numel() * t.element_size()
        if n:
            src = (
                t.view(torch.uint8).reshape(-1).numpy() if t.dtype != torch.bool else t.numpy().view(np.uint8)
            )
            np.frombuffer(buf, dtype=np.uint8, count=n, offset=off)[:] = src.reshape(-1)
    return total


def _build(node: Any, buf: memoryview, offsets: list[int]) -> Any:
    if "t" in node:
        dtype = _FROM_NAME.get(node["dtype"])
        if dtype is None:
            raise BatchCodecError(f"unknown dtype {node['dtype']!r} in encoded batch")
        shape = [int(s) for s in node["shape"]]
        numel = int(np.prod(shape)) if shape else 1
        n = numel * torch.empty((), dtype=dtype).element_size()
        off = offsets[node["t"]]
        if off + n > len(buf):
            raise BatchCodecError("encoded batch is truncated")
        out = torch.empty(shape, dtype=dtype)
        if n:
            out.view(torch.uint8).reshape(-1).numpy()[:] = np.frombuffer(
                buf, dtype=np.uint8, count=n, offset=off
            )
        return out
    if "v" in node:
        return node["v"]
    if "seq" in node:
        items = [_build(x, buf, offsets) for x in node["seq"]]
        return tuple(items) if node.get("tuple") else items
    if "map" in node:
        return {k: _build(v, buf, offsets) for k, v in node["map"].items()}
    raise BatchCodecError("malformed batch header")


def _tensor_sizes(node: Any, sizes: dict[int, int]) -> None:
    if "t" in node:
        dtype = _FROM_NAME.get(node.get("dtype"))
        if dtype is None:
            raise BatchCodecError(f"unknown dtype {node.get('dtype')!r} in encoded batch")
        numel = int(np.prod(node["shape"])) if node["shape"] else 1
        sizes[int(node["t"])] = numel * torch.empty((), dtype=dtype).element_size()
    for child in node.get("seq", []):
        _tensor_sizes(child, sizes)
    for child in node.get("map", {}).values():
        _tensor_sizes(child, sizes)


def decode(buf: memoryview) -> Any:
    """Rebuild a batch from bytes written by :func:`encode_into` (copies out of ``buf``)."""
    if len(buf) < _PREFIX.size:
        raise BatchCodecError("encoded batch is truncated")
    magic, header_len = _PREFIX.unpack_from(buf, 0)
    if magic != _MAGIC or _PREFIX.size + header_len > len(buf):
        raise BatchCodecError("bytes are not an encoded coordl batch")
    try:
        node = json.loads(bytes(buf[_PREFIX.size : _PREFIX.size + header_len]))
    except ValueError as e:
        raise BatchCodecError(f"malformed batch header: {e}") from None
    sizes: dict[int, int] = {}
    _tensor_sizes(node, sizes)
    offsets, offset = [], _align(_PREFIX.size + header_len)
    for i in range(len(sizes)):
        offsets.append(offset)
        offset = _align(offset + sizes[i])
    return _build(node, buf, offsets)

"""The byte format of a cached sample: the project's one codec (:mod:`shmem.codec`), one array per value.

A value is a ``shmem.codec`` frame whose tree is the sample's array, written under the sample's key:
values cross processes (shared memory) and sockets (Redis), so they are never pickled, and every field
is checked before an array is built. The frame's key tag refuses a value stored under another key
(a stale or foreign entry), its CRC-32s a torn or corrupted one, and only plain numeric dtypes are
accepted. Anything that does not check out raises :class:`CodecError`; callers count it as an error
and treat the key as a miss, never serving the value.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shmem import codec as frame

__all__ = ["CodecError", "decode", "encode", "encode_parts", "payload_view"]


class CodecError(ValueError):
    """A cached value whose header, key tag, length or checksum does not match, or an unstorable array."""


def payload_view(array: np.ndarray) -> memoryview:
    """The C-order bytes of ``array`` as a flat byte view (no copy when already contiguous)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


def _leaf(array: np.ndarray) -> np.ndarray:
    array = np.asarray(array)  # a NumPy scalar becomes a 0-d array
    if array.dtype.kind not in "biufc" or array.dtype.fields is not None:
        raise CodecError(f"memcache stores plain numeric arrays only, not dtype {array.dtype}")
    return np.ascontiguousarray(array)


def encode_parts(key: str | bytes, array: np.ndarray) -> list[Any]:
    """The value of ``array`` under ``key`` as buffers to write back to back (header, then the array)."""
    try:
        return frame.encode_parts(_leaf(array), key)
    except frame.CodecError as e:
        raise CodecError(f"value of key {key!r}: {e}") from None


def encode(key: str | bytes, array: np.ndarray) -> bytes:
    """The value as one bytes object (for Redis)."""
    return b"".join(bytes(p) for p in encode_parts(key, array))


def decode(key: str | bytes, value: Any, *, copy: bool = True, verify: bool = True) -> np.ndarray:
    """Check ``value`` against ``key`` and return its array (a copy; a read-only view if ``copy=False``).

    ``verify=False`` skips the payload CRC (the header, its CRC and the key tag are always checked): for
    a store that checked the bytes already (:class:`memcache.LocalStore`'s table does on every read).

    Raises:
        CodecError: the message names the key and what failed.
    """
    try:
        array = frame.decode(value, key, copy=copy, verify_payload=verify)
    except frame.CodecError as e:
        raise CodecError(f"value of key {key!r}: {e}") from None
    if not isinstance(array, np.ndarray):
        raise CodecError(f"value of key {key!r} holds {type(array).__name__}, not an array")
    if not copy:
        array.flags.writeable = False  # a view of a shared cache: nobody may write through it
    return array

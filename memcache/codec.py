"""The byte format of a cached sample: a fixed 104-byte header followed by the raw array bytes.

Values cross processes (shared memory) and sockets (Redis), so they are never pickled: a cache server
reachable by other processes could otherwise make us run its code. The header is parsed field by field
and every field is checked before an array is built:

    offset size field
    0      4    magic b"MCv1"
    4      1    version (1)
    5      1    ndim (0..8)
    6      2    reserved (0)
    8      8    dtype string, ASCII, NUL-padded (numpy ``dtype.str``: "|u1", "<f4", ...)
    16     8    key tag: first 8 bytes of BLAKE2b(key), so a value stored under another key is refused
    24     8    payload length in bytes
    32     4    CRC-32 of the payload
    36     4    reserved (0)
    40     64   shape: 8 little-endian uint64, unused dims 0

Anything that does not check out raises :class:`CodecError`; callers count it as an error and treat
the key as a miss, never serving the value.
"""

from __future__ import annotations

import hashlib
import struct
import zlib

import numpy as np

__all__ = ["HEADER_BYTES", "CodecError", "encode", "encode_header", "decode", "key_tag", "payload_view"]

_MAGIC = b"MCv1"
_VERSION = 1
_MAX_NDIM = 8
_HEADER = struct.Struct("<4sBB2x8s8sQI4x8Q")
HEADER_BYTES = _HEADER.size  # 104
# Only plain numeric dtypes: an object or structured dtype could not be rebuilt safely from bytes.
_ALLOWED_KINDS = frozenset("biufc")


class CodecError(ValueError):
    """A cached value whose header, key tag, length or checksum does not match."""


def key_tag(key: str | bytes) -> bytes:
    """8-byte tag of ``key`` stored in the header: a value read under another key is refused."""
    if isinstance(key, str):
        key = key.encode()
    return hashlib.blake2b(key, digest_size=8).digest()


def payload_view(array: np.ndarray) -> memoryview:
    """The C-order bytes of ``array`` as a flat byte view (no copy when already contiguous)."""
    return memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))


def _check_dtype(dtype: np.dtype) -> bytes:
    if dtype.kind not in _ALLOWED_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise CodecError(f"memcache stores plain numeric arrays only, not dtype {dtype}")
    return dtype.str.encode("ascii")


def encode_header(key: str | bytes, array: np.ndarray) -> bytes:
    """The header for ``array`` stored under ``key`` (payload = ``array``'s C-order bytes)."""
    if array.ndim > _MAX_NDIM:
        raise CodecError(f"memcache stores arrays of at most {_MAX_NDIM} dims, got shape {array.shape}")
    dtype_raw = _check_dtype(array.dtype)
    payload = payload_view(array)
    shape = list(array.shape) + [0] * (_MAX_NDIM - array.ndim)
    return _HEADER.pack(
        _MAGIC,
        _VERSION,
        array.ndim,
        dtype_raw,
        key_tag(key),
        payload.nbytes,
        zlib.crc32(payload),
        *shape,
    )


def encode(key: str | bytes, array: np.ndarray) -> bytes:
    """Header + payload as one bytes object (for Redis)."""
    return encode_header(key, array) + payload_view(array).tobytes()


def decode(
    key: str | bytes, value: bytes | memoryview, *, copy: bool = True, verify: bool = True
) -> np.ndarray:
    """Check ``value`` against ``key`` and return its array (a copy; a read-only view if ``copy=False``).

    ``verify=False`` skips the CRC (the header and key tag are always checked): for a store whose
    writers publish a value only once it is complete, so that no torn read is possible.

    Raises:
        CodecError: bad magic/version/dtype/shape, a key tag of another key, a length that does not
            match, or (when ``verify``) a checksum that does not match.
    """
    view = memoryview(value).cast("B")
    if view.nbytes < HEADER_BYTES:
        raise CodecError(f"value of key {key!r} is {view.nbytes} bytes, shorter than the header")
    magic, version, ndim, dtype_raw, tag, length, crc, *shape = _HEADER.unpack_from(view)
    if magic != _MAGIC or version != _VERSION:
        raise CodecError(f"value of key {key!r} has no memcache v1 header")
    if tag != key_tag(key):
        raise CodecError(f"value stored under key {key!r} belongs to another key (stale or foreign)")
    if ndim > _MAX_NDIM or length != view.nbytes - HEADER_BYTES:
        raise CodecError(
            f"value of key {key!r}: header says {length} bytes, found {view.nbytes - HEADER_BYTES}"
        )
    try:
        dtype = np.dtype(dtype_raw.rstrip(b"\0").decode("ascii"))
    except (TypeError, UnicodeDecodeError) as e:
        raise CodecError(f"value of key {key!r}: bad dtype {dtype_raw!r}") from e
    _check_dtype(dtype)
    dims = tuple(shape[:ndim])
    if int(np.prod(dims, dtype=np.int64)) * dtype.itemsize != length:
        raise CodecError(f"value of key {key!r}: shape {dims} x {dtype} does not fill {length} bytes")
    payload = view[HEADER_BYTES:]
    if verify and zlib.crc32(payload) != crc:
        raise CodecError(f"value of key {key!r}: checksum mismatch (torn or corrupted)")
    array = np.frombuffer(payload, dtype=dtype).reshape(dims)
    if copy:
        return array.copy()
    array.flags.writeable = False  # a view of a shared cache: nobody may write through it
    return array

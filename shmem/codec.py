"""The project's one byte format for values that cross a process or a socket: a tree of arrays, bytes, scalars.

Never pickle: a value read from shared memory, a cache server or a peer is parsed field by field, and
every field is checked before a leaf is built, so a reachable port or a corrupted slot can at worst make
a read fail with :class:`CodecError`, never run code. Why this module is long: the format, its encoder
and its checked decoder belong together; every check is a few lines and none can be left out.

A frame is::

    prefix   40 bytes, struct "<4sBBHIIQII8s":
             magic b"SHC1" | version u8 (1) | kind u8 (the caller's) | flags u16 | header_len u32 |
             header_crc u32 | payload_len u64 | payload_crc u32 | reserved u32 (0) | key_tag 8 bytes
    header   header_len bytes of UTF-8 JSON describing the tree
    padding  zeros up to a 64-byte boundary
    payload  payload_len bytes: the leaves back to back, each at a 64-byte aligned offset

``header_crc`` is the CRC-32 of the prefix (every byte but ``header_crc`` itself) followed by the header,
so a flipped ``kind``, length or key tag is caught, not only a flipped header byte. ``payload_crc`` is the
CRC-32 of the payload, or 0 with flag bit 0 (:data:`FLAG_NO_PAYLOAD_CRC`) set when the writer chose
not to checksum bytes it had verified before (a cache serving what it checked on the way in); other
flag bits are refused. ``key_tag`` is the first 8 bytes of BLAKE2b(key) (zeros without a key): a value
stored under one key and read under another is refused.

The header is a tree of nodes: a JSON list is a list, ``{"t": [...]}`` a tuple, ``{"d": {...}}`` a dict
with str keys; leaves are ``{"a": [offset, nbytes], "dtype": "<f4", "shape": [...]}`` (a NumPy array),
``{"b": [offset, nbytes]}`` (raw bytes) and ``{"v": value}`` (int, float, bool, None or str). Offsets
are relative to the payload's start.

Decoded arrays are zero-copy views of the buffer (``copy=False``): the frame's 64-byte alignment keeps
them aligned when the buffer is (shared-memory slots are page aligned).
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import zlib
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "PREFIX_BYTES",
    "MAX_HEADER_BYTES",
    "MAX_DEPTH",
    "MAX_NDIM",
    "DEFAULT_MAX_PAYLOAD",
    "CodecError",
    "Prefix",
    "key_tag",
    "encoded_size",
    "encode_into",
    "encode",
    "encode_parts",
    "decode",
    "FLAG_NO_PAYLOAD_CRC",
    "read_prefix",
    "frame_size",
]

MAGIC = b"SHC1"
VERSION = 1
_PREFIX = struct.Struct("<4sBBHIIQII8s")
PREFIX_BYTES = _PREFIX.size  # 40
MAX_HEADER_BYTES = 1 << 20  # a header describing more than this is refused (a tree of ~10^4 leaves fits)
MAX_DEPTH = 16  # nesting of lists / tuples / dicts
MAX_NDIM = 8
DEFAULT_MAX_PAYLOAD = 1 << 30  # callers reading from a socket should pass their own, smaller bound
ALIGN = 64
_ALLOWED_KINDS = frozenset("biufc")  # plain numbers and bool: no object, structured or datetime dtypes
_DTYPE_RE = re.compile(r"^[<>|=][biufc][0-9]{1,2}$")
_ZEROS = bytes(ALIGN)
_NO_KEY = bytes(8)
FLAG_NO_PAYLOAD_CRC = 1  # the writer did not checksum the payload (its bytes were verified before)
_KNOWN_FLAGS = FLAG_NO_PAYLOAD_CRC


class CodecError(ValueError):
    """A frame failed a check; the message names the check (magic, version, header crc, key tag, ...)."""


class Prefix(NamedTuple):
    """The fixed first :data:`PREFIX_BYTES` of a frame, unpacked and checked."""

    kind: int
    flags: int
    header_len: int
    header_crc: int
    payload_len: int
    payload_crc: int
    key_tag: bytes
    payload_start: int
    total: int


def _align(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


def key_tag(key: str | bytes) -> bytes:
    """The 8-byte tag of ``key`` stored in the prefix (zeros for the empty key)."""
    if isinstance(key, str):
        key = key.encode()
    return hashlib.blake2b(key, digest_size=8).digest() if key else _NO_KEY


# -- encoding ----------------------------------------------------------------------------------------


class _Plan:
    """The header and the leaves' byte views of one tree, with each leaf's payload offset."""

    def __init__(self, tree: Any) -> None:
        self.leaves: list[tuple[int, memoryview]] = []  # (payload offset, bytes)
        self.payload_len = 0
        node = self._walk(tree, 0, "tree")
        self.header = json.dumps(node, separators=(",", ":"), ensure_ascii=False).encode()
        if len(self.header) > MAX_HEADER_BYTES:
            raise CodecError(
                f"header length {len(self.header)} exceeds the limit of {MAX_HEADER_BYTES} bytes"
            )
        self.payload_start = _align(PREFIX_BYTES + len(self.header))
        self.total = self.payload_start + self.payload_len

    def _leaf(self, view: memoryview) -> list[int]:
        off = _align(self.payload_len)
        self.leaves.append((off, view))
        self.payload_len = off + view.nbytes
        return [off, view.nbytes]

    def _walk(self, obj: Any, depth: int, path: str) -> Any:
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return {"v": obj}
        if isinstance(obj, (np.ndarray, np.generic)):
            return self._array(np.asarray(obj), path)
        if isinstance(obj, (bytes, bytearray, memoryview)):
            view = memoryview(obj)
            if not view.c_contiguous:
                raise CodecError(f"{path}: a memoryview leaf must be C-contiguous")
            return {"b": self._leaf(view.cast("B") if view.ndim != 1 or view.format != "B" else view)}
        if isinstance(obj, (list, tuple, dict)):
            if depth >= MAX_DEPTH:
                raise CodecError(f"{path}: nesting too deep (more than {MAX_DEPTH} levels)")
            if isinstance(obj, dict):
                out = {}
                for k, v in obj.items():
                    if not isinstance(k, str):
                        raise TypeError(f"{path}: dict keys must be str, got {type(k).__name__} {k!r}")
                    out[k] = self._walk(v, depth + 1, f"{path}[{k!r}]")
                return {"d": out}
            items = [self._walk(v, depth + 1, f"{path}[{i}]") for i, v in enumerate(obj)]
            return {"t": items} if isinstance(obj, tuple) else items
        raise TypeError(
            f"{path}: cannot encode {type(obj).__name__} (arrays, bytes, scalars, list/tuple/dict)"
        )

    def _array(self, arr: np.ndarray, path: str) -> dict:
        dt = arr.dtype
        if dt.kind not in _ALLOWED_KINDS or dt.fields is not None or dt.subdtype is not None:
            raise CodecError(f"{path}: dtype not allowed: {dt} (only plain numeric and bool dtypes)")
        if arr.ndim > MAX_NDIM:
            raise CodecError(f"{path}: ndim {arr.ndim} exceeds {MAX_NDIM}")
        if not arr.flags.c_contiguous:
            arr = arr.copy(order="C")  # (np.ascontiguousarray would turn a 0-d array into 1-d)
        view = arr.reshape(-1).view(np.uint8).data
        return {"a": self._leaf(view), "dtype": dt.str, "shape": list(arr.shape)}

    def prefix(self, key: str | bytes, kind: int, checksum: bool) -> bytes:
        if not 0 <= kind <= 255:
            raise ValueError(f"kind must be 0..255, got {kind}")
        tag = key_tag(key)
        flags, payload_crc = (0, self.payload_crc()) if checksum else (FLAG_NO_PAYLOAD_CRC, 0)
        raw = _PREFIX.pack(
            MAGIC, VERSION, kind, flags, len(self.header), 0, self.payload_len, payload_crc, 0, tag
        )
        crc = zlib.crc32(self.header, _prefix_crc(raw))
        return raw[:12] + struct.pack("<I", crc) + raw[16:]

    def payload_crc(self) -> int:
        crc, end = 0, 0
        for off, view in self.leaves:
            crc = zlib.crc32(_ZEROS[: off - end], crc)
            crc = zlib.crc32(view, crc)
            end = off + view.nbytes
        return crc


def _prefix_crc(prefix: bytes | memoryview) -> int:
    """CRC of the prefix without its header_crc field (bytes 12..16)."""
    return zlib.crc32(prefix[16:PREFIX_BYTES], zlib.crc32(prefix[:12]))


def encoded_size(tree: Any) -> int:
    """Bytes :func:`encode` would produce for ``tree`` (e.g. to size a shared-memory slot)."""
    return _Plan(tree).total


def encode_into(buf: Any, tree: Any, key: str | bytes = b"", kind: int = 0, *, checksum: bool = True) -> int:
    """Write ``tree``'s frame at the start of the writable buffer ``buf``; returns the bytes written.

    ``checksum=False`` writes no payload CRC (a flag tells readers): only for bytes verified before,
    e.g. a cache serving items it checked when they were stored; the header is always checksummed.

    Raises:
        CodecError: ``buf`` is too small, or the tree breaks a limit (dtype, ndim, depth, header size).
        TypeError: the tree holds a value that has no encoding.
    """
    plan = _Plan(tree)
    out = memoryview(buf).cast("B")
    if out.readonly:
        raise CodecError("encode_into needs a writable buffer")
    if out.nbytes < plan.total:
        raise CodecError(f"buffer of {out.nbytes} bytes is too small for a frame of {plan.total} bytes")
    out[:PREFIX_BYTES] = plan.prefix(key, kind, checksum)
    h_end = PREFIX_BYTES + len(plan.header)
    out[PREFIX_BYTES:h_end] = plan.header
    out[h_end : plan.payload_start] = _ZEROS[: plan.payload_start - h_end]
    end = plan.payload_start
    for off, view in plan.leaves:
        start = plan.payload_start + off
        out[end:start] = _ZEROS[: start - end]
        end = start + view.nbytes
        out[start:end] = view
    return plan.total


def encode_parts(tree: Any, key: str | bytes = b"", kind: int = 0, *, checksum: bool = True) -> list[Any]:
    """``tree``'s frame as a list of buffers (the leaves themselves, not copies) to send with ``sendmsg``.

    The leaves must not change until the parts are sent.
    """
    plan = _Plan(tree)
    h_end = PREFIX_BYTES + len(plan.header)
    parts: list[Any] = [plan.prefix(key, kind, checksum) + plan.header + _ZEROS[: plan.payload_start - h_end]]
    end = 0
    for off, view in plan.leaves:
        if off > end:
            parts.append(_ZEROS[: off - end])
        if view.nbytes:
            parts.append(view)
        end = off + view.nbytes
    return parts


def encode(tree: Any, key: str | bytes = b"", kind: int = 0, *, checksum: bool = True) -> bytes:
    """``tree``'s frame as bytes (one copy of each leaf)."""
    return b"".join(encode_parts(tree, key, kind, checksum=checksum))


# -- decoding ----------------------------------------------------------------------------------------


def read_prefix(buf: Any, *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> Prefix:
    """Unpack and check a frame's prefix (magic, version, flags, lengths against the limits).

    The CRCs are not checked here (they need the rest of the frame): :func:`decode` does.
    """
    view = memoryview(buf).cast("B")
    if view.nbytes < PREFIX_BYTES:
        raise CodecError(f"truncated frame: {view.nbytes} bytes, the prefix alone is {PREFIX_BYTES}")
    magic, version, kind, flags, h_len, h_crc, p_len, p_crc, reserved, tag = _PREFIX.unpack(
        view[:PREFIX_BYTES]
    )
    if magic != MAGIC:
        raise CodecError(f"bad magic {bytes(magic)!r} (expected {MAGIC!r}): not a frame of this codec")
    if version != VERSION:
        raise CodecError(f"unsupported version {version} (this codec reads version {VERSION})")
    if flags & ~_KNOWN_FLAGS or reserved:
        raise CodecError(f"unknown flags {flags:#x} / reserved {reserved:#x}")
    if h_len > MAX_HEADER_BYTES:
        raise CodecError(f"header length {h_len} exceeds the limit of {MAX_HEADER_BYTES} bytes")
    if p_len > max_payload:
        raise CodecError(f"payload length {p_len} exceeds max_payload={max_payload}")
    start = _align(PREFIX_BYTES + h_len)
    return Prefix(kind, flags, h_len, h_crc, p_len, p_crc, bytes(tag), start, start + p_len)


def frame_size(prefix_bytes: Any, *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> int:
    """Total length of the frame whose first :data:`PREFIX_BYTES` bytes are ``prefix_bytes``.

    A socket reader reads the prefix, calls this, then reads exactly the rest: the lengths were checked
    against :data:`MAX_HEADER_BYTES` and ``max_payload`` before it commits any memory.
    """
    return read_prefix(prefix_bytes, max_payload=max_payload).total


def decode(
    buf: Any,
    key: str | bytes = b"",
    *,
    copy: bool = False,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
    verify_payload: bool = True,
) -> Any:
    """The tree of the frame at the start of ``buf`` (bytes after the frame are ignored).

    Args:
        key: the key the value was stored under; a frame written under another key is refused.
        copy: False: arrays are views of ``buf`` and raw leaves memoryviews of it (``buf`` must stay
            alive and unchanged while they are used). True: arrays own their memory, raw leaves are bytes.
        max_payload: refuse frames that announce a larger payload.
        verify_payload: check the payload CRC (turn off only where the bytes were checked before, e.g.
            a shared-memory slot verified when it was written).

    Raises:
        CodecError: any check failed; the message names it.
    """
    view = memoryview(buf).cast("B")
    p = read_prefix(view, max_payload=max_payload)
    if view.nbytes < p.total:
        raise CodecError(f"truncated frame: {view.nbytes} bytes of {p.total}")
    h_end = PREFIX_BYTES + p.header_len
    header = view[PREFIX_BYTES:h_end]
    if zlib.crc32(header, _prefix_crc(view[:PREFIX_BYTES])) != p.header_crc:
        raise CodecError("header crc mismatch: the prefix or the header is corrupt")
    if p.key_tag != key_tag(key):
        raise CodecError("key tag mismatch: the value was written under another key")
    if any(view[h_end : p.payload_start]):
        raise CodecError("header padding is not zero")
    payload = view[p.payload_start : p.total]
    checked = not p.flags & FLAG_NO_PAYLOAD_CRC
    if verify_payload and checked and zlib.crc32(payload) != p.payload_crc:
        raise CodecError("payload crc mismatch: the payload is corrupt")
    try:
        node = json.loads(bytes(header).decode("utf-8"))
    except RecursionError:
        raise CodecError(f"nesting too deep (more than {MAX_DEPTH} levels)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CodecError(f"header is not UTF-8 JSON: {exc}") from None
    return _Reader(payload, copy).node(node, 0)


class _Reader:
    """Builds leaves from a checked payload, validating every node of the header."""

    def __init__(self, payload: memoryview, copy: bool) -> None:
        self.payload = payload
        self.copy = copy

    def _span(self, spec: Any) -> tuple[int, int]:
        if not (isinstance(spec, list) and len(spec) == 2 and all(type(x) is int for x in spec)):
            raise CodecError(f"bad leaf span {spec!r}: expected [offset, nbytes]")
        off, n = spec
        if off < 0 or n < 0 or off + n > self.payload.nbytes:
            raise CodecError(f"leaf offsets [{off}, {n}] outside the payload of {self.payload.nbytes} bytes")
        if off % ALIGN:
            raise CodecError(f"leaf offset {off} is not {ALIGN}-byte aligned")
        return off, n

    def node(self, node: Any, depth: int) -> Any:
        if isinstance(node, list):
            return [self.child(x, depth) for x in node]
        if not isinstance(node, dict) or len(node) not in (1, 3):
            raise CodecError(f"bad header node {str(node)[:80]!r}")
        if "v" in node and len(node) == 1:
            v = node["v"]
            if v is not None and not isinstance(v, (bool, int, float, str)):
                raise CodecError(f"bad scalar leaf {str(v)[:80]!r}")
            return v
        if "b" in node and len(node) == 1:
            off, n = self._span(node["b"])
            raw = self.payload[off : off + n]
            return bytes(raw) if self.copy else raw
        if "t" in node and len(node) == 1 and isinstance(node["t"], list):
            return tuple(self.child(x, depth) for x in node["t"])
        if "d" in node and len(node) == 1 and isinstance(node["d"], dict):
            return {k: self.child(v, depth) for k, v in node["d"].items()}
        if "a" in node and len(node) == 3:
            return self.array(node)
        raise CodecError(f"bad header node {str(node)[:80]!r}")

    def child(self, node: Any, depth: int) -> Any:
        if isinstance(node, (list, dict)) and not _is_leaf(node) and depth + 1 >= MAX_DEPTH:
            raise CodecError(f"nesting too deep (more than {MAX_DEPTH} levels)")
        return self.node(node, depth + 1)

    def array(self, node: dict) -> np.ndarray:
        dstr, shape = node.get("dtype"), node.get("shape")
        if not isinstance(dstr, str) or not _DTYPE_RE.match(dstr):
            raise CodecError(f"dtype not allowed: {str(dstr)[:40]!r}")
        try:
            dt = np.dtype(dstr)
        except TypeError:
            raise CodecError(f"dtype not allowed: {dstr!r}") from None
        if dt.kind not in _ALLOWED_KINDS:
            raise CodecError(f"dtype not allowed: {dstr!r}")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise CodecError(f"bad shape {str(shape)[:80]!r}")
        if len(shape) > MAX_NDIM:
            raise CodecError(f"ndim {len(shape)} exceeds {MAX_NDIM}")
        off, n = self._span(node["a"])
        count = 1
        for d in shape:
            count *= d
        if count * dt.itemsize != n:
            raise CodecError(f"shape/nbytes mismatch: shape {shape} of {dstr} is not {n} bytes")
        arr = np.frombuffer(self.payload, dtype=dt, count=count, offset=off).reshape(shape)
        return arr.copy() if self.copy else arr


def _is_leaf(node: Any) -> bool:
    return isinstance(node, dict) and len(node) in (1, 3) and ("v" in node or "b" in node or "a" in node)

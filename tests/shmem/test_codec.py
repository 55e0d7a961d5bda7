"""shmem.codec: round trips of every leaf and nesting, zero-copy views, every corruption refused by name, fuzz."""

from __future__ import annotations

import json
import random
import struct
import zlib

import numpy as np
import pytest

from shmem import codec
from shmem.codec import PREFIX_BYTES, CodecError, decode, encode, encode_into, encoded_size, frame_size


def same(a, b) -> bool:
    """Structural equality that also compares array dtypes/shapes and bytes-likes by content."""
    if isinstance(a, np.ndarray):
        return (
            isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
        )
    if isinstance(a, (bytes, bytearray, memoryview)):
        return isinstance(b, (bytes, memoryview)) and bytes(a) == bytes(b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and a != a:
        return isinstance(b, float) and b != b
    return type(a) is type(b) and a == b


def sample_tree() -> dict:
    rng = np.random.default_rng(0)
    return {
        "img": rng.integers(0, 255, (3, 5, 7), dtype=np.uint8),
        "f32": rng.standard_normal((4, 4)).astype(np.float32),
        "f64be": np.arange(5, dtype=">f8"),
        "c64": (np.arange(3) + 1j).astype(np.complex64),
        "mask": np.array([True, False, True]),
        "scalar0d": np.array(7, dtype=np.int64),
        "empty": np.zeros((0, 3), dtype=np.int16),
        "raw": b"\x00\x01hello",
        "empty_raw": b"",
        "values": [1, -(2**62), 3.5, True, None, "héllo", float("inf")],
        "tup": (1, (2, [b"x", np.int32(4)])),
        "nested": {"a": {"b": {"c": [np.ones(2)]}}},
    }


def test_round_trip_every_leaf_and_nesting():
    tree = sample_tree()
    frame = encode(tree, key="k1", kind=9)
    assert len(frame) == encoded_size(tree) == frame_size(frame[:PREFIX_BYTES])
    out = decode(frame, key="k1")
    expect = dict(tree)
    expect["tup"] = (1, (2, [b"x", np.array(4, dtype=np.int32)]))
    assert same(expect, out)
    assert codec.read_prefix(frame).kind == 9
    assert same(expect, decode(frame, key=b"k1", copy=True))


def test_top_level_leaves_and_empty_containers():
    for tree in [b"abc", np.arange(3), 5, "s", None, [], (), {}, [[[]]]]:
        out = decode(encode(tree))
        assert same(tree if not isinstance(tree, np.ndarray) else tree, out), tree


def test_zero_copy_views_and_copy():
    arr = np.arange(1000, dtype=np.float32).reshape(10, 100)
    buf = bytearray(encoded_size({"x": arr, "r": b"abcd"}) + 100)  # a slot larger than the frame
    n = encode_into(buf, {"x": arr, "r": b"abcd"})
    assert n == len(buf) - 100
    out = decode(buf)
    assert np.shares_memory(out["x"], np.frombuffer(buf, np.uint8))
    assert out["x"].ctypes.data % 64 == (np.frombuffer(buf, np.uint8).ctypes.data % 64)  # aligned as buf is
    assert isinstance(out["r"], memoryview) and bytes(out["r"]) == b"abcd"
    copied = decode(buf, copy=True)
    assert not np.shares_memory(copied["x"], np.frombuffer(buf, np.uint8))
    assert isinstance(copied["r"], bytes)


def test_non_contiguous_array_is_encoded_by_value():
    arr = np.arange(24).reshape(4, 6)[:, ::2]
    assert np.array_equal(decode(encode(arr)), arr)


def test_unchecksummed_payload_and_parts():
    tree = {"x": np.arange(10), "r": b"abc"}
    frame = encode(tree, checksum=False)
    assert codec.read_prefix(frame).flags == codec.FLAG_NO_PAYLOAD_CRC
    bad = bytearray(frame)
    bad[-1] ^= 1
    assert bytes(decode(bad)["r"]) == b"abb"  # not checked: the writer said so
    bad = bytearray(frame)
    bad[6] = 0  # clearing the flag is caught by the header crc
    with pytest.raises(CodecError, match="header crc"):
        decode(bad)
    assert b"".join(codec.encode_parts(tree, kind=3)) == encode(tree, kind=3)


def test_encode_into_refuses_small_or_readonly_buffer():
    with pytest.raises(CodecError, match="too small"):
        encode_into(bytearray(10), b"abc")
    with pytest.raises(CodecError, match="writable"):
        encode_into(bytes(1000), b"abc")


@pytest.mark.parametrize(
    "tree, exc, msg",
    [
        (np.array([object()]), CodecError, "dtype not allowed"),
        (np.zeros(2, dtype=[("a", "i4")]), CodecError, "dtype not allowed"),
        (np.zeros(2, dtype="datetime64[s]"), CodecError, "dtype not allowed"),
        (np.zeros((1,) * 9), CodecError, "ndim"),
        ({1: 2}, TypeError, "keys must be str"),
        (object(), TypeError, "cannot encode"),
        ([[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]], CodecError, "nesting too deep"),
    ],
)
def test_encode_refuses(tree, exc, msg):
    with pytest.raises(exc, match=msg):
        encode(tree)


def test_depth_limit_is_exactly_max_depth():
    tree: list = [1]
    for _ in range(codec.MAX_DEPTH - 1):
        tree = [tree]
    assert same(tree, decode(encode(tree)))


# -- corruption -----------------------------------------------------------------------------------------


def frame_parts():
    tree = {"x": np.arange(100, dtype=np.int32), "r": b"payload"}
    frame = bytearray(encode(tree, key="k"))
    p = codec.read_prefix(frame)
    return tree, frame, p


def reseal(frame: bytearray, header: bytes | None = None, **fields) -> bytearray:
    """Rewrite prefix fields (and optionally the header) with a valid header CRC: a forged frame."""
    p = codec.read_prefix(frame, max_payload=1 << 62)
    old_header = bytes(frame[PREFIX_BYTES : PREFIX_BYTES + p.header_len])
    header = old_header if header is None else header
    payload = bytes(frame[p.payload_start : p.total])
    vals = dict(
        magic=codec.MAGIC, version=1, kind=p.kind, flags=0, header_len=len(header), payload_len=p.payload_len,
        payload_crc=p.payload_crc, reserved=0, tag=p.key_tag,
    )  # fmt: skip
    vals.update(fields)
    raw = struct.pack(
        "<4sBBHIIQII8s", vals["magic"], vals["version"], vals["kind"], vals["flags"], vals["header_len"], 0,
        vals["payload_len"], vals["payload_crc"], vals["reserved"], vals["tag"],
    )  # fmt: skip
    crc = zlib.crc32(header, zlib.crc32(raw[16:], zlib.crc32(raw[:12])))
    raw = raw[:12] + struct.pack("<I", crc) + raw[16:]
    start = -(-(PREFIX_BYTES + len(header)) // 64) * 64
    return bytearray(raw + header + bytes(start - PREFIX_BYTES - len(header)) + payload)


def forge_header(frame: bytearray, mutate) -> bytearray:
    p = codec.read_prefix(frame)
    node = json.loads(bytes(frame[PREFIX_BYTES : PREFIX_BYTES + p.header_len]))
    mutate(node)
    return reseal(frame, json.dumps(node).encode())


def test_each_corruption_is_refused_by_name():
    _, frame, p = frame_parts()
    cases = {
        "bad magic": lambda f: f.__setitem__(0, ord("X")),
        "unsupported version": lambda f: f.__setitem__(4, 2),
        "header crc": lambda f: f.__setitem__(PREFIX_BYTES + 3, f[PREFIX_BYTES + 3] ^ 1),
        "payload crc": lambda f: f.__setitem__(p.payload_start + 5, f[p.payload_start + 5] ^ 0x10),
        "header crc ": lambda f: f.__setitem__(5, 3),  # kind is covered by the header crc
        "header padding": lambda f: f.__setitem__(p.payload_start - 1, 1),
    }
    for msg, mutate in cases.items():
        bad = bytearray(frame)
        mutate(bad)
        with pytest.raises(CodecError, match=msg.strip()):
            decode(bad, key="k")


def test_truncated_and_oversized_and_wrong_key():
    _, frame, p = frame_parts()
    for n in (0, 10, PREFIX_BYTES, p.payload_start, len(frame) - 1):
        with pytest.raises(CodecError, match="truncated"):
            decode(frame[:n], key="k")
    with pytest.raises(CodecError, match="key tag"):
        decode(frame, key="other")
    with pytest.raises(CodecError, match="key tag"):
        decode(frame)  # no key given, frame written under one
    with pytest.raises(CodecError, match="max_payload"):
        decode(frame, key="k", max_payload=100)
    with pytest.raises(CodecError, match="header length"):
        frame_size(reseal(frame, header_len=codec.MAX_HEADER_BYTES + 1)[:PREFIX_BYTES])
    with pytest.raises(CodecError, match="max_payload"):
        frame_size(reseal(frame, payload_len=1 << 40)[:PREFIX_BYTES])
    with pytest.raises(CodecError, match="flags"):
        decode(reseal(frame, flags=2), key="k")


def test_forged_headers_are_refused():
    _, frame, _ = frame_parts()

    def set_leaf(field, value):
        return lambda n: n["d"]["x"].__setitem__(field, value)

    cases = {
        "dtype not allowed": [set_leaf("dtype", "|O"), set_leaf("dtype", "<V8"), set_leaf("dtype", "<M8")],
        "shape/nbytes": [set_leaf("shape", [101])],
        "outside the payload": [set_leaf("a", [1 << 40, 400]), set_leaf("a", [-64, 400])],
        "not 64-byte aligned": [set_leaf("a", [1, 400])],
        "ndim": [set_leaf("shape", [1] * 9)],
        "bad header node": [
            lambda n: n["d"].__setitem__("x", {"z": 1}),
            lambda n: n["d"].__setitem__("x", 5),
        ],
        "bad scalar": [lambda n: n["d"].__setitem__("x", {"v": [1]})],
        "bad leaf span": [set_leaf("a", [0])],
    }
    for msg, mutators in cases.items():
        for mutate in mutators:
            with pytest.raises(CodecError, match=msg):
                decode(forge_header(frame, mutate), key="k")
    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(CodecError, match="nesting too deep"):
        decode(reseal(frame, deep), key="k")
    deep17 = b"[" * 17 + b"]" * 17
    with pytest.raises(CodecError, match="nesting too deep"):
        decode(reseal(frame, deep17), key="k")
    with pytest.raises(CodecError, match="not UTF-8 JSON"):
        decode(reseal(frame, b"\xff{"), key="k")


def test_fuzz_never_raises_anything_but_codec_error():
    """5,000 seeded random mutations: each decode raises CodecError or returns the identical tree."""
    tree, frame, _ = frame_parts()
    rng = random.Random(1234)
    outcomes = {"refused": 0, "same": 0}
    for _ in range(5000):
        bad = bytearray(frame)
        op = rng.randrange(4)
        if op == 0:  # flip bits
            for _ in range(rng.randint(1, 4)):
                bad[rng.randrange(len(bad))] ^= 1 << rng.randrange(8)
        elif op == 1:  # truncate
            bad = bad[: rng.randrange(len(bad))]
        elif op == 2:  # random bytes over a span
            i = rng.randrange(len(bad))
            bad[i : i + rng.randint(1, 16)] = rng.randbytes(rng.randint(1, 16))
        else:  # forged header with random garbage, valid CRC
            g = rng.randbytes(rng.randint(0, 64))
            bad = reseal(bytearray(frame), g)
        try:
            out = decode(bad, key="k")
        except CodecError:
            outcomes["refused"] += 1
            continue
        assert same(tree, out)
        outcomes["same"] += 1
    assert outcomes["refused"] > 4000

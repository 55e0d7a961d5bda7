"""The value format: round trips, and every kind of mismatch is refused (never served)."""

from __future__ import annotations

import numpy as np
import pytest

from memcache.codec import CodecError, decode, encode
from memcache.keys import KeySpace


@pytest.mark.parametrize("dtype", ["uint8", "float32", "int64", ">f8"])
def test_round_trip(dtype):
    a = (np.arange(2 * 3 * 5) % 7).astype(dtype).reshape(2, 3, 5)
    b = decode("k", encode("k", a))
    assert b.dtype == a.dtype and b.shape == a.shape and np.array_equal(a, b)
    assert b.flags.writeable  # random augmentation may work in place


def test_zero_dim_and_empty():
    assert decode("k", encode("k", np.float32(3.5).reshape(()))) == np.float32(3.5)
    assert decode("k", encode("k", np.zeros((0, 4), np.uint8))).shape == (0, 4)


def test_value_of_another_key_is_refused():
    with pytest.raises(CodecError, match="another key"):
        decode("mc1:x:2", encode("mc1:x:1", np.ones(4)))


def test_corrupted_payload_and_truncation_are_refused():
    v = bytearray(encode("k", np.arange(100, dtype=np.uint8)))
    v[-5] ^= 0xFF  # a payload byte
    with pytest.raises(CodecError, match="crc"):
        decode("k", bytes(v))
    with pytest.raises(CodecError):
        decode("k", encode("k", np.arange(100))[:-1])
    with pytest.raises(CodecError, match="magic"):
        decode("k", b"\x80\x04pickle" + bytes(200))


def test_object_arrays_are_not_stored():
    with pytest.raises(CodecError, match="numeric"):
        encode("k", np.array([{"a": 1}], dtype=object))


def test_keys_change_with_either_identity():
    a = KeySpace("data", "resize224").key(7)
    assert a != KeySpace("data", "resize256").key(7)
    assert a != KeySpace("data2", "resize224").key(7)
    assert KeySpace("ab", "c").key(7) != KeySpace("a", "bc").key(7)
    assert a == KeySpace("data", "resize224").key(7)

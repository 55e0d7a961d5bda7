"""coordl.coordinated.batchcodec: torch batches through shared memory on the one codec, never pickled."""

from __future__ import annotations

import pytest
import torch

from coordl.coordinated import batchcodec


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


def test_round_trip_of_every_supported_element() -> None:
    g = torch.Generator().manual_seed(0)
    batch = (
        torch.rand(4, 3, 8, 8, generator=g),
        torch.arange(4),
        {"mask": torch.rand(4, generator=g) > 0.5, "half": torch.rand(4, generator=g).bfloat16(), "n": 3},
        [torch.zeros(0, 5, dtype=torch.uint8), 2.5, True],
    )
    buf = memoryview(bytearray(batchcodec.encoded_size(batch)))
    used = batchcodec.encode_into(batch, buf)
    assert used <= len(buf)
    assert _same(batchcodec.decode(buf), batch)


def test_too_small_a_slot_and_foreign_bytes_are_named() -> None:
    batch = (torch.ones(100),)
    with pytest.raises(batchcodec.BatchCodecError, match="staging slot has 10"):
        batchcodec.encode_into(batch, memoryview(bytearray(10)))
    with pytest.raises(batchcodec.BatchCodecError, match="not an encoded coordl batch"):
        batchcodec.decode(memoryview(b"\x80\x04pickle" + bytes(100)))
    with pytest.raises(batchcodec.BatchCodecError, match="type object"):
        batchcodec.encoded_size((object(),))

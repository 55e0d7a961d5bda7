"""Compressor round trips, payload sizes and the error-feedback invariant (single process)."""

from __future__ import annotations

import pytest
import torch

from gradcomp.collectives import merge_topk, pack, unpack
from gradcomp.compressors import k_for
from gradcomp.memory import ResidualMemory
from gradcomp.methods import NAMES, get_compressor


def _x(n: int = 1000, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", ["topk", "mstopk", "randomk"])
def test_sparsifiers_keep_k_entries_and_payload_size_matches(name: str) -> None:
    comp = get_compressor(name, 0.01)
    payload, ctx = comp.compress(_x(), key="w")
    dense = comp.decompress(payload, ctx)
    assert int((dense != 0).sum()) == k_for(1000, 0.01) == 10
    assert comp.payload_bytes(1000) <= sum(t.numel() * t.element_size() for t in payload)


def test_sparsifier_at_ratio_one_is_lossless() -> None:
    for name in ("topk", "mstopk", "randomk"):
        comp = get_compressor(name, 1.0)
        x = _x()
        assert torch.equal(comp.decompress(*comp.compress(x, "w")), x)


def test_sparse_aggregate_sums_overlapping_indices() -> None:
    comp = get_compressor("topk", 0.5)
    a, b = torch.tensor([3.0, 0.0, 1.0, 0.0]), torch.tensor([2.0, 0.0, 0.0, 5.0])
    pa, ctx = comp.compress(a)
    pb, _ = comp.compress(b)
    assert torch.equal(comp.aggregate([pa, pb], ctx), torch.tensor([5.0, 0.0, 1.0, 5.0]))


def test_randomk_picks_the_same_indices_on_every_rank_and_changes_per_step() -> None:
    a, b = get_compressor("randomk", 0.1, seed=7), get_compressor("randomk", 0.1, seed=7)
    i1 = a.compress(_x(), "w")[0][1]
    assert torch.equal(i1, b.compress(_x(seed=1), "w")[0][1])
    assert not torch.equal(i1, a.compress(_x(), "w")[0][1])


def _rounding_sd(name: str, x: torch.Tensor, levels: int) -> torch.Tensor:
    """Standard deviation of one decoded entry: a Bernoulli(p) rounding step times the step size."""
    if name == "qsgd":
        step = x.norm() / levels
        scaled = x.abs() / step
        p = scaled - scaled.floor()
    else:  # terngrad: scale * Bernoulli(|x| / scale)
        step = x.abs().max()
        p = x.abs() / step
    return step * (p * (1 - p)).sqrt()


@pytest.mark.parametrize("name", ["qsgd", "terngrad"])
def test_quantisers_are_unbiased_on_average(name: str) -> None:
    x = _x(200)
    draws = 2000
    comp = get_compressor(name, levels=4)
    torch.manual_seed(0)  # the quantisers draw from the global generator (conftest restores it afterwards)
    mean = torch.stack([comp.decompress(*comp.compress(x)) for _ in range(draws)]).mean(0)
    # The mean of 2000 draws has standard error sd / sqrt(2000) per entry (sd from the rounding probabilities).
    # 6 standard errors: with 200 entries a false failure has probability about 200 * 2e-9 for any seed, while
    # a rounding that is biased (e.g. always down) misses by up to a whole step, ~10 standard errors or more.
    bound = 6 * _rounding_sd(name, x, 4) / draws**0.5 + 1e-5
    assert bool(((mean - x).abs() <= bound).all()), (mean - x).abs().max()


def test_sign_packs_eight_entries_per_byte() -> None:
    comp = get_compressor("signsgd")
    x = _x(1001)
    payload, ctx = comp.compress(x)
    assert payload[1].numel() == 126 and payload[1].dtype == torch.uint8
    out = comp.decompress(payload, ctx)
    assert torch.equal(torch.sign(out), torch.sign(x).where(x != 0, torch.ones_like(x)))


def test_casts_keep_dtype_on_decompress() -> None:
    for name, wire in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        comp = get_compressor(name)
        payload, ctx = comp.compress(_x())
        assert payload[0].dtype == wire
        assert comp.decompress(payload, ctx).dtype == torch.float32


@pytest.mark.parametrize("name", ["topk", "mstopk", "randomk", "signsgd", "qsgd", "terngrad", "fp16"])
def test_error_feedback_sent_plus_residual_equals_sum_of_gradients(name: str) -> None:
    comp = get_compressor(name, 0.05, levels=8)
    mem = ResidualMemory()
    total_in = torch.zeros(500)
    total_sent = torch.zeros(500)
    for step in range(20):
        g = _x(500, seed=step)
        total_in += g
        c = mem.compensate(g, "w")
        payload, ctx = comp.compress(c, "w")
        sent = comp.decompress(payload, ctx)
        mem.update(c, "w", sent)
        total_sent += sent
    assert torch.allclose(total_sent + mem.residual("w"), total_in, atol=1e-4)


def test_pack_unpack_round_trips_mixed_dtypes() -> None:
    parts = [_x(3), torch.arange(4, dtype=torch.int32), torch.tensor([1, -1], dtype=torch.int8)]
    buf = pack(parts)
    assert buf.dtype == torch.uint8 and buf.numel() == 12 + 16 + 2
    for a, b in zip(parts, unpack(buf, parts), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="layout"):
        unpack(buf[:-1], parts)


def test_unpack_a_peer_payload_that_starts_unaligned_in_the_gather_buffer() -> None:
    # QSGD's payload (4-byte norm + 1 byte per entry) of 7 entries is 11 bytes: in an all-gather output the second
    # rank's payload starts at byte 11, so its float32 norm must be copied out, not viewed in place.
    comp = get_compressor("qsgd", levels=127)
    like, _ = comp.compress(_x(7))
    gathered = torch.cat([pack(like), pack(like)])
    n = pack(like).numel()
    for r in range(2):
        for a, b in zip(like, unpack(gathered[r * n : (r + 1) * n], like), strict=True):
            assert torch.equal(a, b)


def test_merge_topk_is_symmetric() -> None:
    ia, va = torch.tensor([0, 5, 9]), torch.tensor([1.0, -2.0, 3.0])
    ib, vb = torch.tensor([5, 2, 7]), torch.tensor([1.5, 0.1, -4.0])
    ab, ba = merge_topk(ia, va, ib, vb, 3), merge_topk(ib, vb, ia, va, 3)
    assert torch.equal(ab[0], ba[0]) and torch.equal(ab[1], ba[1])
    assert ab[0].tolist() == [0, 7, 9]


def test_unknown_name_is_rejected_with_the_choices() -> None:
    with pytest.raises(ValueError, match="mstopk"):
        get_compressor("zip")
    assert {
        "none",
        "fp16",
        "topk",
        "mstopk",
        "randomk",
        "qsgd",
        "terngrad",
        "signsgd",
        "powersgd",
        "gtopk",
    } <= set(NAMES)

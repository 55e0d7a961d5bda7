"""The CUDA path of MSTopK, top-k and the sparse compressors (runs only where a GPU is present)."""

from __future__ import annotations

import pytest
import torch

import gradcomp
from gradcomp.memory import ResidualMemory
from gradcomp.methods import get_compressor

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("n,density", [(1_000_000, 0.001), (10_000_000, 0.01)])
def test_mstopk_on_cuda_is_exact_k_with_high_recall(n: int, density: float) -> None:
    x = torch.randn(n, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    k = int(n * density)
    values, idx = gradcomp.mstopk(x, k)
    assert idx.device.type == "cuda" and idx.numel() == k
    assert torch.unique(idx).numel() == k
    assert torch.equal(values, x[idx])
    assert gradcomp.recall(idx, x, k) > 0.95


def test_mstopk_cuda_matches_cpu_selection() -> None:
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(1))
    _, cpu = gradcomp.mstopk(x, 500)
    _, gpu = gradcomp.mstopk(x.cuda(), 500)
    assert set(cpu.tolist()) == set(gpu.cpu().tolist())


@pytest.mark.parametrize("name", ["topk", "mstopk", "signsgd", "qsgd", "terngrad", "fp16"])
def test_compressors_round_trip_on_cuda_with_error_feedback(name: str) -> None:
    comp = get_compressor(name, 0.01)
    mem = ResidualMemory()
    g = torch.randn(50_000, device="cuda", generator=torch.Generator("cuda").manual_seed(2))
    c = mem.compensate(g, "w")
    payload, ctx = comp.compress(c, "w")
    assert all(t.device.type == "cuda" for t in payload)
    sent = comp.decompress(payload, ctx)
    mem.update(c, "w", sent)
    assert torch.allclose(sent + mem.residual("w"), g, atol=1e-5)
    assert comp.aggregate([payload, payload], ctx).device.type == "cuda"

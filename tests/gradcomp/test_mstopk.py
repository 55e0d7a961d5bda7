"""MSTopK returns exactly k distinct indices with values = x[indices]; its recall against torch.topk is measured."""

from __future__ import annotations

import pytest
import torch

import gradcomp


@pytest.mark.parametrize("n,k", [(1, 1), (10, 3), (1000, 1), (1000, 10), (100_000, 100), (200_000, 2000)])
def test_mstopk_returns_exactly_k_distinct_entries(n: int, k: int) -> None:
    x = torch.randn(n, generator=torch.Generator().manual_seed(n + k))
    values, idx = gradcomp.mstopk(x, k)
    assert idx.numel() == k
    assert torch.unique(idx).numel() == k
    assert torch.equal(values, x[idx])


@pytest.mark.parametrize("fill", [0.0, 1.0, -3.0])
def test_mstopk_handles_constant_tensors(fill: float) -> None:
    values, idx = gradcomp.mstopk(torch.full((100,), fill), 7)
    assert idx.numel() == 7 and torch.unique(idx).numel() == 7


def test_mstopk_k_at_least_numel_returns_everything_and_zero_returns_nothing() -> None:
    x = torch.randn(5, generator=torch.Generator().manual_seed(5))
    assert gradcomp.mstopk(x, 9)[1].numel() == 5
    assert gradcomp.mstopk(x, 0)[1].numel() == 0


def test_mstopk_recall_against_torch_topk_is_high_on_gaussian_gradients() -> None:
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(0))
    recalls = [gradcomp.recall(gradcomp.mstopk(x, k)[1], x, k) for k in (100, 1000)]
    print("mstopk recall", recalls)
    assert min(recalls) > 0.95


def test_mstopk_recall_when_kth_value_is_below_the_mean() -> None:
    # Heavy tail plus k close to n: the k-th magnitude lies below mean|x|, so the search must start from 0.
    x = torch.cat([torch.full((10,), 1000.0), torch.rand(990, generator=torch.Generator().manual_seed(4))])
    _, idx = gradcomp.mstopk(x, 500)
    assert gradcomp.recall(idx, x, 500) > 0.9


def test_random_fill_slice_still_exact_k() -> None:
    x = torch.ones(1000)
    _, idx = gradcomp.mstopk(x, 10, generator=torch.Generator().manual_seed(3))
    assert torch.unique(idx).numel() == 10


def test_topk_is_by_magnitude_and_signed() -> None:
    x = torch.tensor([0.1, -5.0, 2.0, -0.2])
    values, idx = gradcomp.topk(x, 2)
    assert sorted(idx.tolist()) == [1, 2]
    assert sorted(values.tolist()) == [-5.0, 2.0]


def test_non_1d_input_is_rejected_with_its_shape() -> None:
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        gradcomp.mstopk(torch.zeros(2, 3), 1)

"""Top-k selection of a 1-D gradient: exact (``torch.topk``) and MSTopK (sort-free threshold search).

MSTopK (Shi et al., MLSys 2021) binary-searches a magnitude threshold between mean|x| and max|x| with a fixed
number of counting passes, keeps everything above the best threshold whose count is <= k, and fills up to exactly
k from a contiguous slice of the next band. Each pass is memory-bound (compare + count), so on large tensors it
beats a sort-based top-k, and it always returns exactly k entries, which keeps all-gather payloads fixed-size.
The search runs on 0-d device tensors, so a CUDA input needs no host synchronisation until the final gather.
"""

from __future__ import annotations

import torch

__all__ = ["mstopk", "topk", "recall"]


def _check(x: torch.Tensor, k: int) -> None:
    if x.dim() != 1:
        raise ValueError(f"top-k needs a 1-D tensor, got shape {tuple(x.shape)}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k by magnitude: returns ``(values, indices)`` with ``values = x[indices]`` (signed)."""
    _check(x, k)
    k = min(k, x.numel())
    _, idx = torch.topk(x.abs(), k, sorted=False)
    return x[idx], idx


def mstopk(
    x: torch.Tensor, k: int, rounds: int = 20, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Approximate top-k by magnitude without sorting; always exactly ``min(k, numel)`` entries.

    Args:
        x: 1-D tensor (CPU or CUDA).
        k: number of entries to return.
        rounds: binary-search passes over ``x`` (the paper uses about 20).
        generator: picks where the fill slice starts in the boundary band (``None``: the slice starts at 0,
            which is deterministic).

    Returns:
        ``(values, indices)`` with ``values = x[indices]``; order is by index, not by magnitude.
    """
    _check(x, k)
    d = x.numel()
    if k >= d:
        idx = torch.arange(d, device=x.device)
        return x.clone(), idx
    if k == 0:
        return x[:0].clone(), torch.zeros(0, dtype=torch.long, device=x.device)
    absx = x.abs()
    if absx.dtype not in (torch.float32, torch.float64):
        absx = absx.float()
    kt = torch.tensor(k, device=x.device)
    mean = absx.mean()
    hi = absx.amax()
    # When fewer than k entries reach the mean, the k-th magnitude lies below it: search from 0 instead.
    lo = torch.where(torch.count_nonzero(absx >= mean) > kt, mean, torch.zeros_like(mean))
    left = torch.zeros((), device=x.device, dtype=absx.dtype)
    right = torch.ones((), device=x.device, dtype=absx.dtype)
    k1 = torch.zeros((), device=x.device, dtype=torch.long)  # largest count <= k seen so far
    thr1 = hi + 1  # its threshold (count 0 above max)
    k2 = torch.full((), d, device=x.device, dtype=torch.long)  # smallest count > k seen so far
    thr2 = torch.zeros_like(hi)  # its threshold (everything is >= 0)
    # On CPU, shrink the searched array to the entries >= thr2 once that band is small: every later threshold
    # is above thr2 (it is the search's lower bound), so counts on the subset equal counts on the whole tensor.
    # On CUDA the passes stay on the full tensor so that the loop never waits for the device.
    compact = x.device.type == "cpu"
    pos: torch.Tensor | None = None  # indices of the searched subset in x (None: all of x)
    for _ in range(rounds):
        rho = (left + right) / 2
        t = lo + rho * (hi - lo)
        n = torch.count_nonzero(absx >= t)
        fits = n <= kt
        right = torch.where(fits, rho, right)
        left = torch.where(fits, left, rho)
        better1 = fits & (n > k1)
        k1 = torch.where(better1, n, k1)
        thr1 = torch.where(better1, t, thr1)
        better2 = (~fits) & (n < k2)
        k2 = torch.where(better2, n, k2)
        thr2 = torch.where(better2, t, thr2)
        if compact and int(k2) * 4 < absx.numel():
            keep = torch.nonzero(absx >= thr2, as_tuple=True)[0]
            pos = keep if pos is None else pos[keep]
            absx = absx[keep]
    sel = torch.nonzero(absx >= thr2, as_tuple=True)[0]  # k2 entries, all >= thr2
    cand = sel if pos is None else pos[sel]
    above = absx[sel] >= thr1
    top = cand[above]
    band = cand[~above]
    need = k - top.numel()
    start = 0
    if generator is not None and band.numel() > need:
        start = int(torch.randint(0, band.numel() - need + 1, (1,), generator=generator).item())
    idx = torch.cat([top, band[start : start + need]])
    return x[idx], idx


def recall(approx_indices: torch.Tensor, x: torch.Tensor, k: int) -> float:
    """Fraction of the exact top-k (by magnitude) indices that ``approx_indices`` contains."""
    if k == 0:
        return 1.0
    _, exact = torch.topk(x.abs(), min(k, x.numel()), sorted=False)
    mask = torch.zeros(x.numel(), dtype=torch.bool, device=x.device)
    mask[exact] = True
    return float(mask[approx_indices].sum().item()) / exact.numel()

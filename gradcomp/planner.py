"""When to compress: cost models fitted on-line, SeCoPa-style per-tensor decisions, MG-WFBP-style merging.

Every cost is a straight line ``t(n) = a + b n`` fitted by least squares on a few timed runs of the real thing
(dense all-reduce, the full compressed sync, the compressor alone) on the real link, at register time. Timings are
maxed across ranks before fitting, so every rank fits the same lines and takes the same decisions (a rank that
compressed a bucket its peers sent dense would deadlock). A bucket is compressed only when the model predicts a
clear win (``margin``), so on fast links, where compression rarely pays, buckets stay dense.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = [
    "Line",
    "Decision",
    "fit_line",
    "time_at_sizes",
    "Planner",
    "mgwfbp_merge",
    "suggest_bucket_cap_mb",
]


@dataclass(frozen=True)
class Line:
    """``t(n) = a + b n`` seconds (``n`` in elements or bytes, as documented where it is built)."""

    a: float
    b: float

    def __call__(self, n: float) -> float:
        return self.a + self.b * n


@dataclass(frozen=True)
class Decision:
    """Compress this bucket or not, and into how many pipelined partitions."""

    compress: bool
    partitions: int = 1
    predicted_dense_s: float = 0.0
    predicted_comp_s: float = 0.0


def fit_line(xs: list[float], ts: list[float]) -> Line:
    """Least-squares line through ``(xs, ts)``, with intercept and slope clamped to >= 0."""
    if len(xs) == 1:
        return Line(0.0, max(ts[0], 0.0) / max(xs[0], 1.0))
    mx, mt = statistics.fmean(xs), statistics.fmean(ts)
    var = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (t - mt) for x, t in zip(xs, ts, strict=True)) / var if var else 0.0
    b = max(b, 0.0)
    return Line(max(mt - b * mx, 0.0), b)


def time_at_sizes(
    fn: Callable[[torch.Tensor], object],
    sizes: list[int],
    reps: int = 3,
    device: torch.device | str = "cpu",
    group: dist.ProcessGroup | None = None,
) -> list[float]:
    """Median seconds of ``fn(randn(n))`` for each ``n`` (one untimed warm-up), maxed across ranks."""
    out = []
    gen = torch.Generator().manual_seed(1234)
    for n in sizes:
        x = torch.randn(n, generator=gen).to(device)
        fn(x.clone())
        samples = []
        for _ in range(reps):
            y = x.clone()
            if dist.is_initialized():
                dist.barrier(group=group)
            t0 = time.perf_counter()
            fn(y)
            if y.is_cuda:
                torch.cuda.synchronize(y.device)
            samples.append(time.perf_counter() - t0)
        out.append(statistics.median(samples))
    if dist.is_initialized():
        agreed = torch.tensor(out, dtype=torch.float64)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)
        out = agreed.tolist()
    return out


class Planner:
    """Per-bucket decision from fitted lines (all in elements of float32 gradient).

    Args:
        dense: dense all-reduce time of n elements.
        sync: full compressed sync time of n elements (compress, collective, decode), one partition.
        encode: local compress + decode time of n elements (the part that partitions can overlap with comm).
        margin: compress only if predicted time < (1 - margin) x dense; when unsure, stay dense.
        max_partitions: largest K tried (SeCoPa); 1 disables partitioning.
        min_numel: buckets smaller than this always go dense (start-up latency dominates).
        min_saving_s: and so do buckets whose predicted saving is below this: timing noise on a loaded machine
            is about that large, so a smaller predicted gain is no evidence of a gain.
    """

    def __init__(
        self,
        dense: Line,
        sync: Line,
        encode: Line,
        margin: float = 0.15,
        max_partitions: int = 4,
        min_numel: int = 4096,
        min_saving_s: float = 1e-3,
    ) -> None:
        self.dense, self.sync, self.encode = dense, sync, encode
        self.margin, self.max_partitions, self.min_numel = margin, max_partitions, min_numel
        self.min_saving_s = min_saving_s
        self._cache: dict[int, Decision] = {}

    def predict(self, numel: int, partitions: int) -> float:
        """Predicted compressed time with K pipelined partitions: part i+1 encodes while part i is on the wire."""
        part = numel / partitions
        # The sync timing includes encoding; on a noisy machine the encode-only fit can come out above it, and
        # then K=1 must still predict the measured sync time, not the encode time.
        enc = min(self.encode(part), self.sync(part))
        comm = self.sync(part) - enc
        return enc + (partitions - 1) * max(enc, comm) + comm

    def decide(self, numel: int) -> Decision:
        """Compress ``numel`` elements or not, and with how many partitions (cached; same on every rank)."""
        hit = self._cache.get(numel)
        if hit is not None:
            return hit
        dense_s = self.dense(numel)
        best_k, best_s = 1, self.predict(numel, 1)
        k = 2
        while k <= self.max_partitions:
            s = self.predict(numel, k)
            if s < best_s:
                best_k, best_s = k, s
            k *= 2
        ok = (
            numel >= self.min_numel
            and best_s < (1 - self.margin) * dense_s
            and dense_s - best_s >= self.min_saving_s
        )
        d = Decision(ok, best_k if ok else 1, dense_s, best_s)
        self._cache[numel] = d
        return d

    def describe(self) -> str:
        return (
            f"dense {self.dense.a * 1e3:.3f} ms + {self.dense.b * 1e9:.3f} ns/elem; "
            f"compressed {self.sync.a * 1e3:.3f} ms + {self.sync.b * 1e9:.3f} ns/elem; "
            f"encode {self.encode.a * 1e3:.3f} ms + {self.encode.b * 1e9:.3f} ns/elem"
        )


def mgwfbp_merge(
    sizes_bytes: list[int], backward_s: list[float], alpha_s: float, beta_s_per_byte: float
) -> list[list[int]]:
    """Group layers (given in backward order) so that fewer all-reduce start-ups are paid (MG-WFBP rule).

    A layer joins the current group when its gradient is ready before the group's communication could start
    anyway, or when waiting for it costs less than one start-up ``alpha_s``.
    """
    if not sizes_bytes:
        return []
    ready, t = [], 0.0
    for b in backward_s:
        t += b
        ready.append(t)
    groups = [[0]]
    group_bytes = sizes_bytes[0]
    comm_free = 0.0
    start = ready[0]
    for i in range(1, len(sizes_bytes)):
        if ready[i] <= start or ready[i] - start < alpha_s:
            groups[-1].append(i)
            group_bytes += sizes_bytes[i]
            start = max(ready[i], comm_free)
        else:
            comm_free = start + alpha_s + beta_s_per_byte * group_bytes
            groups.append([i])
            group_bytes = sizes_bytes[i]
            start = max(ready[i], comm_free)
    return groups


def suggest_bucket_cap_mb(
    model: torch.nn.Module, alpha_s: float, beta_s_per_byte: float, backward_s: float
) -> float:
    """A DDP ``bucket_cap_mb`` from MG-WFBP groups of ``model``'s parameters (backward time split by size)."""
    params = [p for p in model.parameters() if p.requires_grad][::-1]
    sizes = [p.numel() * p.element_size() for p in params]
    total = max(sum(sizes), 1)
    groups = mgwfbp_merge(sizes, [backward_s * s / total for s in sizes], alpha_s, beta_s_per_byte)
    largest = max(sum(sizes[i] for i in g) for g in groups)
    return max(1.0, math.ceil(largest / 2**20))

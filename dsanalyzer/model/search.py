"""Questions asked of a what-if model: the grid of predictions, and what it takes to be compute-bound.

Each function takes a :class:`~dsanalyzer.model.whatif.Model` and asks it :meth:`~Model.predict` at
many operating points: the grid over cache size x cores x storage speed x policy that report.json
stores under ``whatif.grid``, and by bisection the smallest cache, core count or storage speed that
reaches the compute rate (``whatif.to_compute_bound``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from dsanalyzer.model.cache import POLICIES
from dsanalyzer.model.rates import TOL

if TYPE_CHECKING:
    from dsanalyzer.model.whatif import Model

__all__ = ["default_axes", "grid", "cache_bytes_for_rate", "fetch_ahead_for_rate", "to_compute_bound"]

MAX_FETCH_AHEAD = 32  # coordl's ObjectStore keeps 32 connections per process: more threads would queue


def default_axes(model: Model) -> tuple[list[int], list[int], list[float]]:
    """Cache sizes (0..100% of the dataset and the measured one), core counts, storage speeds."""
    caches = sorted(
        {round(f * model.dataset_bytes) for f in (0, 0.25, 0.5, 0.75, 1.0)} | {round(model.cache_bytes)}
    )
    cpus = sorted({1, 2, 4, 8, 16, 32, model.cpus})
    storage = [model.storage_bytes_per_s * f for f in (0.5, 1.0, 2.0, 4.0)]
    return caches, cpus, storage


def grid(
    model: Model,
    cache_bytes: list[float] | None = None,
    cpus: list[int] | None = None,
    storage_bytes_per_s: list[float] | None = None,
    policies: tuple[str, ...] = POLICIES,
    gpu_speedup: float = 1.0,
) -> list[dict]:
    """Predictions over cache size x cores x storage speed x policy, as JSON-ready rows."""
    d_cache, d_cpus, d_storage = default_axes(model)
    rows = []
    for policy in policies:
        for cache in cache_bytes or d_cache:
            for c in cpus or d_cpus:
                for bw in storage_bytes_per_s or d_storage:
                    p = model.predict(cache, c, bw, gpu_speedup=gpu_speedup, policy=policy)
                    rows.append(
                        {
                            "cache_bytes": cache,
                            "cpus": c,
                            "storage_bytes_per_s": bw if math.isfinite(bw) else None,
                            "policy": policy,
                            "gpu_speedup": gpu_speedup,
                            "hit_ratio": p.hit_ratio,
                            "samples_per_s": p.samples_per_s,
                            "epoch_s": p.epoch_s,
                            "bound": p.bound,
                        }
                    )
    return rows


def _reaches(model: Model, target: float, **kw: Any) -> bool:
    return model.predict(**kw).steady >= target * (1 - TOL)  # compute-bound: between epoch starts


def cache_bytes_for_rate(
    model: Model,
    target: float,
    cpus: int,
    storage: float,
    policy: str,
    gpu: float = 1.0,
    fetch_ahead: int | None = None,
) -> float | None:
    """Smallest cache (bytes) that reaches ``target`` samples/s, or None when no cache does."""
    kw = {"cpus": cpus, "storage_bytes_per_s": storage, "gpu_speedup": gpu, "policy": policy}
    if fetch_ahead is not None:
        kw["fetch_ahead"] = fetch_ahead
    if not _reaches(model, target, cache_bytes=model.dataset_bytes, **kw):
        return None
    lo, hi = 0.0, model.dataset_bytes
    if _reaches(model, target, cache_bytes=0.0, **kw):
        return 0.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _reaches(model, target, cache_bytes=mid, **kw) else (mid, hi)
    return hi


def fetch_ahead_for_rate(model: Model, target: float, workers: int) -> int:
    """A bucket's read-ahead per worker: the fewest threads that reach ``target``, else the fewest that get
    within 2% of what :data:`MAX_FETCH_AHEAD` threads would (past that the store's ceiling binds)."""

    def rate(ahead: int) -> float:
        return model.predict(
            model.cache_bytes, model.cpus, model.storage_bytes_per_s, policy=model.cache_policy,
            workers=workers, fetch_ahead=ahead,
        ).steady  # fmt: skip

    if workers == 0:  # the main process reads one item at a time: no read-ahead to raise
        return model.fetch_ahead
    best = rate(MAX_FETCH_AHEAD)
    for ahead in range(1, MAX_FETCH_AHEAD + 1):
        r = rate(ahead)
        if r >= target * (1 - TOL) or r >= best * 0.98:
            return max(ahead, model.fetch_ahead)  # never fewer threads than the job has
    return MAX_FETCH_AHEAD


def _storage_for_rate(model: Model, target: float, **kw: Any) -> float | None:
    """Slowest storage (bytes/s) that reaches ``target``: 0 when every read hits, None when none does."""
    if _reaches(model, target, storage_bytes_per_s=1.0, **kw):
        return 0.0  # everything hits the cache: storage speed does not matter
    if not _reaches(model, target, storage_bytes_per_s=1e15, **kw):
        return None
    lo, hi = 1.0, 1e15
    for _ in range(80):  # bisection in log space: speeds span many decades
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if _reaches(model, target, storage_bytes_per_s=mid, **kw) else (mid, hi)
    return hi


def to_compute_bound(model: Model, gpu_speedup: float = 1.0) -> dict:
    """How many cores, how much cache, or how fast a storage until the job is compute-bound.

    Cores: with the data in memory (prep alone). Cache: at the measured storage speed and at
    max(measured cores, cores needed). Storage: at the measured cache and policy.
    """
    target = model.compute_rate(gpu_speedup)
    cpus_needed = model.cores_for_rate(target, gpu_speedup)
    cpus_for_cache = max(model.cpus, cpus_needed or model.cpus)
    cache_needed = {
        p: cache_bytes_for_rate(model, target, cpus_for_cache, model.storage_bytes_per_s, p, gpu_speedup)
        for p in POLICIES
    }
    storage_needed = _storage_for_rate(
        model,
        target,
        cache_bytes=model.cache_bytes,
        cpus=cpus_for_cache,
        policy=model.cache_policy,
        gpu_speedup=gpu_speedup,
    )
    max_rate = model.prep.max_rate()
    return {
        "compute_samples_per_s": target,
        "gpu_speedup": gpu_speedup,
        "cpus_needed": cpus_needed,
        "cache_bytes_needed": cache_needed,
        "cache_assumes_cpus": cpus_for_cache,
        "storage_bytes_per_s_needed": storage_needed,
        "prep_max_samples_per_s": max_rate if math.isfinite(max_rate) else None,  # None: prep keeps scaling
    }

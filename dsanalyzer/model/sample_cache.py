"""The sample cache (``sample_cache=``, ``whatif --sample-cache-gb G``): the deterministic prefix of prep cached.

A split-prep source (``prep_deterministic`` then ``prep_random``) with a memcache store caches each
item's deterministic array (decoded, resized) the first time a worker makes it; from then on a hit
skips the item's fetch and its deterministic prefix, and only the random tail runs (:mod:`coordl.fetch.
sample_cache`). The store fills and never evicts, so the share of samples it serves every epoch is the
share it holds::

    hs      = min(N, floor(G / bytes_per_cached_sample)) / N
    saved   = hs * max(0, det_cpu_s - read_s)            CPU a worker no longer spends per sample
    P'(k)   = P(k) * t_w / (t_w - saved)                  t_w: a worker's CPU per sample as profiled
    C'      = (a*c - spin) / (job_cpu_s - saved)
    fetch   = (1 - hs) * (h*s/membw + (1-h)*s/storage_bw) only misses read their item

``t_w`` is the data path's CPU per sample less the main process's receiving (``prep_cpu_s -
batch_overhead_s/B``; ``1/P(1)`` when not measured), so a hit's prep costs ``t_w - det_cpu_s + read_s``:
the random tail plus what the loader does per sample anyway (collate, hand-over) plus the read.
``det_cpu_s``, ``random_cpu_s``, ``read_s`` and the bytes are measured by the profile's probe
(:mod:`dsanalyzer.measure.remedy_probes`); the rest composes as every operating point does
(:func:`~dsanalyzer.model.rates.compose`), the measured epoch start charged at the new rate. Rates are
epoch 2 on: the first epoch fills the store (all misses, each one's put added).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsanalyzer.model import cores, epoch_start, stages
from dsanalyzer.model.params import JobParams
from dsanalyzer.model.rates import ItemCosts, Prediction, compose
from dsanalyzer.model.remedy import Remedy

__all__ = ["SampleCached", "cached_share", "sample_cached", "remedy"]


@dataclass(frozen=True)
class SampleCached:
    """A sample cache of ``cache_bytes`` at one operating point."""

    cache_bytes: float
    cached_items: int
    hit_ratio: float  # hs: the share of samples served from the store every epoch
    prediction: Prediction
    random_share: float  # the share of a worker's per-sample CPU that still runs on a hit
    memory_bytes: float  # what the store holds at most (its size, or the whole dataset's arrays)


def cached_share(job: JobParams, cache_bytes: float) -> tuple[int, float]:
    """(items a store of ``cache_bytes`` holds, the share of the dataset that is), capped at the dataset."""
    per = job.cached_sample_bytes
    if not per or cache_bytes <= 0 or job.dataset_items <= 0:
        return 0, 0.0
    items = min(job.dataset_items, int(cache_bytes // per))
    return items, items / job.dataset_items


def sample_cached(job: JobParams, cache_bytes: float, point: stages.Point | None = None) -> SampleCached:
    """The job with a sample cache of ``cache_bytes`` at ``point`` (default: as measured)."""
    if job.det_cpu_s is None or not job.cached_sample_bytes:
        raise ValueError(
            f"the sample cache was not measured: {job.sample_cache_why or 'no probe in the report'}"
        )
    if cache_bytes < 0:
        raise ValueError(f"cache_bytes must be >= 0, got {cache_bytes}")
    p = point or stages.point_at(job)
    c, g, w = p.cpus, p.gpu_speedup, p.workers
    items, hs = cached_share(job, cache_bytes)
    saved = hs * max(0.0, job.det_cpu_s - (job.cache_read_s or 0.0))
    t_w = cores.worker_cpu_s(job)
    keep = max(t_w - saved, t_w * 0.02) / t_w
    h = stages.cache_hit_ratio(job, p.policy, p.cache_bytes)
    raw = stages.fetch_costs(job, p, h)
    costs = ItemCosts(raw.hit_s * (1 - hs), raw.miss_s * (1 - hs), raw.miss_overhead_s * (1 - hs))
    per_sample = cores.job_cpu_per_sample(job, g, p.policy, h)
    left = max(per_sample - saved, per_sample * 0.02) if per_sample else None
    cpu = (
        math.inf
        if not left
        else cores.cpu_rate(c, job.cpu_share, left, cores.job_spin_cores(job, c, w, cpu_per_sample=left))
    )
    steady = compose(
        step_per_s=job.compute_per_s * g, compute_per_s=stages.compute_rate(job, g),
        prep_per_s=stages.prep_rate(job, w, c) / keep, costs=costs, h=h, workers=w,
        batch_size=job.batch_size, dataset_items=job.epoch_items or job.dataset_items, cpu_per_s=cpu,
    )  # fmt: skip
    pred = epoch_start.with_start(job, steady, w)
    return SampleCached(
        cache_bytes, items, hs, pred, keep, min(cache_bytes, job.dataset_items * job.cached_sample_bytes)
    )


def remedy(job: JobParams, cache_bytes: float, point: stages.Point | None = None) -> Remedy:
    """The sample cache as a :class:`~dsanalyzer.model.remedy.Remedy`: the rate, the store's memory, its loader argument."""
    if job.det_cpu_s is None or not job.cached_sample_bytes:
        why = job.sample_cache_why or "the split of prep was not measured"
        return Remedy("sample_cache", None, cost={"memory_bytes": cache_bytes}, why_unknown=why)
    sc = sample_cached(job, cache_bytes, point)
    return Remedy(
        "sample_cache",
        sc.prediction.samples_per_s,
        bound=sc.prediction.bound,
        cost={"memory_bytes": sc.memory_bytes},
        loader_args={"sample_cache": f"memcache.LocalStore({int(cache_bytes)})"},
        note=(
            f"{sc.cached_items} of {job.dataset_items} samples cached ({sc.hit_ratio:.0%}); a hit still runs "
            f"{sc.random_share:.0%} of a worker's prep (the random tail, the loader's own work, the read)"
        ),
    )

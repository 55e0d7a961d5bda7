"""Each stage's rate at one operating point, as small pure functions of a job's measured parameters.

An operating point (:class:`Point`) is what a what-if asks for: a cache, cores, a storage speed, a
faster GPU, workers and read-ahead. Each stage of the pipeline gets its rate from one function here:

* :func:`compute_rate`: the step plus the main process's own receive work per batch;
* :func:`cache_hit_ratio`: the share of items a cache of that size serves (:mod:`~dsanalyzer.model.cache`);
* :func:`fetch_costs`: what a hit and a miss cost one item, from files or a bucket
  (:mod:`~dsanalyzer.model.store`);
* :func:`prep_rate`: the fitted prep curve at the workers that fit the cores
  (:mod:`~dsanalyzer.model.scaling`);
* the shared cores' rate: :func:`~dsanalyzer.model.cores.job_cpu_rate`;

and :func:`steady` composes them (:func:`~dsanalyzer.model.rates.compose`, where the formula is). A new
remedy is one more field of :class:`Point` and one more function here (or in a module named for it)
that :func:`steady` asks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dsanalyzer.model.cache import hit_ratio
from dsanalyzer.model.cores import job_cpu_rate
from dsanalyzer.model.params import JobParams
from dsanalyzer.model.rates import ItemCosts, Prediction, compose
from dsanalyzer.model.store import miss_costs

__all__ = [
    "Point",
    "compute_rate",
    "cache_hit_ratio",
    "fetch_costs",
    "prep_rate",
    "in_memory_rate",
    "cores_for_rate",
    "steady",
    "point_at",
    "measured_point",
]


@dataclass(frozen=True)
class Point:
    """One operating point: the settings a prediction is asked for (None: as measured)."""

    cache_bytes: float
    cpus: int
    storage_bytes_per_s: float
    gpu_speedup: float = 1.0
    policy: str = "minio"
    workers: int = 1  # loader workers (0: loading in the main process)
    fetch_ahead: int | None = None  # read-ahead threads per worker (a bucket's concurrency)
    items_per_request: float | None = None  # items one store request brings
    read_hit_ratio: float | None = None  # reads charged a cached read's CPU (None: the cache's hit ratio)


def compute_rate(job: JobParams, gpu_speedup: float = 1.0) -> float:
    """The most samples/s the job can reach: the step plus the main process's per-batch cost."""
    own = job.batch_overhead_s / (job.cpu_share * job.batch_size)
    return 1.0 / (1.0 / (job.compute_per_s * gpu_speedup) + own)


def cache_hit_ratio(job: JobParams, policy: str, cache_bytes: float) -> float:
    """``h``: the share of reads a ``policy`` cache of ``cache_bytes`` serves (1 when nothing is read)."""
    s = job.avg_item_bytes
    return hit_ratio(policy, cache_bytes / s, job.dataset_items) if s > 0 else 1.0


def fetch_costs(job: JobParams, point: Point, h: float) -> ItemCosts:
    """Seconds a hit (from memory) and a miss (from storage, or a bucket's request) cost one item."""
    s = job.avg_item_bytes
    hit_s = s / job.mem_bandwidth_bytes_per_s if job.mem_bandwidth_bytes_per_s else 0.0
    if job.store is None:
        return ItemCosts(
            hit_s=hit_s, miss_s=s / point.storage_bytes_per_s, miss_overhead_s=job.storage_overhead_s
        )
    # A miss from a bucket: the store's rates at this loader's concurrency (model/store.py).
    bandwidth = point.storage_bytes_per_s
    store = job.store if bandwidth == job.storage_bytes_per_s else job.store.with_bandwidth(bandwidth)
    ahead = job.fetch_ahead if point.fetch_ahead is None else int(point.fetch_ahead)
    k = job.items_per_request if point.items_per_request is None else float(point.items_per_request)
    miss_s, own_s = miss_costs(store, s, h, point.workers, ahead, k, job.batch_size)
    return ItemCosts(hit_s=hit_s, miss_s=miss_s, miss_overhead_s=own_s)


def prep_rate(job: JobParams, workers: int, cpus: int) -> float:
    """``P``: samples/s of prep by ``workers`` workers on ``cpus`` cores (the main process when 0)."""
    return job.prep.rate(min(max(workers, 1), cpus))


def in_memory_rate(job: JobParams, cpus: int, gpu_speedup: float = 1.0) -> float:
    """Samples/s with every item in memory and one worker per core: fetch free, prep and step left."""
    cpu = job_cpu_rate(job, cpus, gpu_speedup=gpu_speedup)
    return min(compute_rate(job, gpu_speedup), job.prep.rate(cpus), cpu)


def cores_for_rate(
    job: JobParams, target: float, gpu_speedup: float = 1.0, max_cores: int = 4096
) -> int | None:
    """Fewest cores whose in-memory rate reaches ``target`` (None: no core count does)."""
    for c in range(1, max_cores + 1):
        if in_memory_rate(job, c, gpu_speedup) >= target * (1 - 1e-9):
            return c
        if c > job.prep.peak_cores() and job.prep.rate(c) < target:
            return None
    return None


def steady(job: JobParams, point: Point) -> Prediction:
    """The stages' rate at ``point`` between epoch starts (``Model.predict`` adds the starts)."""
    h = cache_hit_ratio(job, point.policy, point.cache_bytes)
    w, g = point.workers, point.gpu_speedup
    return compose(
        step_per_s=job.compute_per_s * g,
        compute_per_s=compute_rate(job, g),
        prep_per_s=prep_rate(job, w, point.cpus),
        costs=fetch_costs(job, point, h),
        h=h,
        workers=w,
        batch_size=job.batch_size,
        dataset_items=job.epoch_items or job.dataset_items,
        cpu_per_s=job_cpu_rate(
            job, point.cpus, w, g, point.policy, h if point.read_hit_ratio is None else point.read_hit_ratio
        ),
    )


def measured_point(job: JobParams) -> Point:
    """The point the profile measured, its reads charged as the real run read them (it began evicted)."""
    return replace(point_at(job), read_hit_ratio=job.real_read_hit_ratio)


def point_at(
    job: JobParams,
    cache_bytes: float | None = None,
    cpus: int | None = None,
    storage_bytes_per_s: float | None = None,
    gpu_speedup: float = 1.0,
    policy: str | None = None,
    workers: int | None = None,
) -> Point:
    """The measured operating point with the given settings changed (None: as measured; ``workers``
    follows ``cpus`` when only the cores change, as ``Model.predict``)."""
    w = workers if workers is not None else (job.workers if cpus is None else int(cpus))
    return Point(
        job.cache_bytes if cache_bytes is None else cache_bytes,
        job.cpus if cpus is None else int(cpus),
        job.storage_bytes_per_s if storage_bytes_per_s is None else storage_bytes_per_s,
        gpu_speedup,
        policy or job.cache_policy,
        int(w),
    )

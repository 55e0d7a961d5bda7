"""What-if model: predict samples/s and epoch time for another cache size, core count, storage speed or GPU.

The job is a pipeline of stages and runs at the rate of its slowest one (Plumber-style rate model)::

    observed = min(G * gpu_speedup,           compute: the step alone (measured run 1)
                   F(h, storage),             fetch: the storage device and memory bus, shared by all workers
                   W(workers, cores, h))      worker cycle: each worker fetches *then* preps its items

* ``h`` is the cache hit ratio from ``cachemodel`` (MinIO: the cached fraction; page cache: LRU under
  random access, far lower when the dataset does not fit).
* Fetch stage, aggregate over all workers: ``F = 1 / (h * s / membw + (1 - h) * s / storage_bw)`` items/s,
  with ``s`` the mean item size, ``membw`` the measured memory bandwidth and ``storage_bw`` the measured
  (or asked) storage bandwidth. The storage bandwidth is a property of the device, shared by the
  parallel fetch streams of the workers, so it is *not* multiplied by the worker count.
* Worker cycle: a DataLoader worker reads an item and then preps it; its own read latency is not
  overlapped with its own prep. With ``w`` workers on ``c`` cores each item costs a worker
  ``t_fetch = h * s / membw + (1 - h) * (s / storage_bw + overhead_s)`` plus ``w / P(min(w, c))`` of prep,
  so ``W = w / (t_fetch + w / P(min(w, c)))``. With a free fetch this is the prep rate P from ``scaling``.
  This term is why adding workers helps a latency-bound fetch even when the device is not saturated.

``bound`` follows the differential definition: compute when the prediction equals the compute rate,
prep when it equals the in-memory pipeline rate (prep stall = its gap to compute), fetch otherwise
(fetch stall = the rest). Rates are steady-state (epoch 2 on); a cold first epoch is all misses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dsanalyzer.model.cache import POLICIES, hit_ratio
from dsanalyzer.model.scaling import PrepScaling

__all__ = ["Model", "Prediction", "format_bytes"]

_TOL = 1e-6


@dataclass(frozen=True)
class Prediction:
    """A predicted operating point: rate, epoch time, binding stage and every stage's rate."""

    samples_per_s: float
    epoch_s: float
    bound: str
    stage_rates: dict = field(default_factory=dict)
    hit_ratio: float = 0.0
    per_iter_s: dict = field(default_factory=dict)


def _get(report: dict, *keys: str, required: bool = True, default=None):
    node = report
    for key in keys:
        if not isinstance(node, dict) or key not in node or node[key] is None:
            if required:
                raise ValueError(
                    f"report.json: missing field {'.'.join(keys)!r}, which the what-if model needs"
                )
            return default
        node = node[key]
    return node


def _positive(value, name: str) -> float:
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"report.json: {name} must be a positive number, got {value}")
    return value


def _batch_overhead_s(
    report: dict, batch: int, compute_per_s: float, prep_per_s: float, workers: int
) -> float:
    """Main-process seconds per batch that add to the step (receiving a batch from a worker).

    Run 2 (the full job, items from memory) runs at ``1 / (1/G + overhead/B)`` when prep has room to
    spare; below both G and the loader-alone rate P(w), the gap is that overhead. When run 2 runs at
    about P(w), prep binds and the overhead cannot be told apart: 0. Run 2's rate is taken from its
    block-median iteration (``summary.iter_s``) where recorded, so that one pause of the process (a
    410 ms step among 30 ms ones in a demo profile) is not read as a per-batch cost of every batch.
    """
    rate2 = _get(report, "runs", "prep", "samples_per_s", required=False)
    summary = _get(report, "runs", "prep", "summary", required=False) or {}
    iter_s, items = summary.get("iter_s"), summary.get("batch_size")
    if isinstance(iter_s, (int, float)) and isinstance(items, (int, float)) and iter_s > 0 and items > 0:
        rate2 = items / iter_s
    if not rate2 or workers == 0 or not math.isfinite(float(rate2)) or float(rate2) <= 0:
        return 0.0
    rate2 = float(rate2)
    if rate2 >= 0.97 * prep_per_s or rate2 >= compute_per_s:
        return 0.0
    return max(0.0, batch / rate2 - batch / compute_per_s)


@dataclass(frozen=True)
class Model:
    """Measured parameters of one job, and the predictions made from them."""

    dataset_items: int
    avg_item_bytes: float
    batch_size: int
    compute_per_s: float
    prep: PrepScaling
    storage_bytes_per_s: float
    storage_overhead_s: float = 0.0
    mem_bandwidth_bytes_per_s: float | None = None
    cpus: int = 1
    workers: int = 1
    cache_bytes: float = 0.0
    cache_policy: str = "pagecache"
    prep_points: tuple = ()  # the measured (workers, samples/s) pairs the prep curve was fitted to
    batch_overhead_s: float = 0.0  # main-process cost per batch in series with the step (from run 2)

    @classmethod
    def from_report(cls, report: dict) -> Model:
        """Build the model from the measured fields of a report.json (schema_version 1)."""
        cpus = int(_get(report, "machine", "cpus"))
        avg = _get(report, "dataset", "avg_item_bytes", required=False)
        items = int(_get(report, "dataset", "items"))
        if not avg and not _get(report, "dataset", "bytes", required=False):
            note = _get(report, "dataset", "size_note", required=False, default=None)
            raise ValueError(f"report.json: the dataset's item size is unknown: {note or 'give --data DIR'}")
        if avg is None:
            avg = _positive(_get(report, "dataset", "bytes"), "dataset.bytes") / max(1, items)
        avg = _positive(avg, "dataset.avg_item_bytes")
        scaling = _get(report, "prep_scaling", required=False) or {}
        ks, rates = scaling.get("workers") or [], scaling.get("samples_per_s") or []
        if not ks:  # a single measured point: the prep rate at the run's worker count
            ks = [max(1, int(_get(report, "workers", required=False, default=1)))]
            rates = [_positive(_get(report, "rates_per_s", "prep"), "rates_per_s.prep")]
        storage_bw = _positive(_get(report, "fetch", "bytes_per_s"), "fetch.bytes_per_s")
        items_per_s = _get(report, "fetch", "items_per_s", required=False)
        # per-item cost beyond bandwidth (open, request latency): what items/s shows that bytes/s does not
        overhead = 0.0 if not items_per_s else max(0.0, 1.0 / float(items_per_s) - avg / storage_bw)
        membw = _get(report, "machine", "mem_bandwidth_bytes_per_s", required=False)
        policy = _get(report, "cache_policy", required=False, default="pagecache")
        if policy not in POLICIES:
            raise ValueError(f"report.json: cache_policy {policy!r} is not one of {', '.join(POLICIES)}")
        workers = max(0, int(_get(report, "workers", required=False, default=cpus)))
        batch = int(_get(report, "batch_size"))
        compute = _positive(_get(report, "rates_per_s", "compute"), "rates_per_s.compute")
        prep = PrepScaling.fit(list(ks), list(rates), physical_cores=cpus)
        return cls(
            dataset_items=items,
            avg_item_bytes=avg,
            batch_size=batch,
            compute_per_s=compute,
            prep=prep,
            storage_bytes_per_s=storage_bw,
            storage_overhead_s=overhead,
            mem_bandwidth_bytes_per_s=float(membw) if membw else None,
            cpus=cpus,
            workers=workers,
            cache_bytes=float(_get(report, "cache_bytes", required=False, default=0.0)),
            cache_policy=policy,
            prep_points=tuple((int(k), float(r)) for k, r in zip(ks, rates, strict=True)),
            batch_overhead_s=_batch_overhead_s(
                report, batch, compute, prep.rate(min(max(workers, 1), cpus)), workers
            ),
        )

    @property
    def dataset_bytes(self) -> float:
        return self.dataset_items * self.avg_item_bytes

    def params(self) -> dict:
        """JSON-ready model parameters (what report.json stores under ``model``)."""
        return {
            "formula": "min(1/(1/(G*gpu_speedup) + batch_overhead_s/B), 1/(h*s/membw + (1-h)*s/storage_bw), "
            "w/(t_fetch + w/P(min(w,c))))",
            "dataset_items": self.dataset_items,
            "avg_item_bytes": self.avg_item_bytes,
            "batch_size": self.batch_size,
            "compute_samples_per_s": self.compute_per_s,
            "prep_scaling": self.prep.params(),
            "storage_bytes_per_s": self.storage_bytes_per_s,
            "storage_overhead_s": self.storage_overhead_s,
            "batch_overhead_s": self.batch_overhead_s,
            "mem_bandwidth_bytes_per_s": self.mem_bandwidth_bytes_per_s,
            "measured_at": {
                "cpus": self.cpus,
                "workers": self.workers,
                "cache_bytes": self.cache_bytes,
                "cache_policy": self.cache_policy,
            },
        }

    def compute_rate(self, gpu_speedup: float = 1.0) -> float:
        """The most samples/s the job can reach: the step plus the main process's per-batch cost."""
        return 1.0 / (1.0 / (self.compute_per_s * gpu_speedup) + self.batch_overhead_s / self.batch_size)

    def predict(
        self,
        cache_bytes: float,
        cpus: int,
        storage_bytes_per_s: float,
        gpu_speedup: float = 1.0,
        policy: str = "minio",
        workers: int | None = None,
    ) -> Prediction:
        """Predicted steady-state rate with this cache, core count, storage speed and GPU speed-up.

        ``workers`` defaults to ``cpus`` (one loader worker per core); 0 means loading in the main
        process, in series with the step.
        """
        if cpus < 1:
            raise ValueError(f"cpus must be >= 1, got {cpus}")
        if storage_bytes_per_s <= 0 or gpu_speedup <= 0:
            raise ValueError("storage_bytes_per_s and gpu_speedup must be positive")
        w = int(cpus) if workers is None else int(workers)
        if w < 0:
            raise ValueError(f"workers must be >= 0, got {w}")
        s, b = self.avg_item_bytes, self.batch_size
        h = hit_ratio(policy, cache_bytes / s, self.dataset_items)
        hit_s = s / self.mem_bandwidth_bytes_per_s if self.mem_bandwidth_bytes_per_s else 0.0
        miss_s = s / storage_bytes_per_s
        step = self.compute_per_s * gpu_speedup
        compute = self.compute_rate(gpu_speedup)
        fetch_s = h * hit_s + (1 - h) * miss_s
        fetch = math.inf if fetch_s <= 0 else 1.0 / fetch_s
        prep = self.prep.rate(min(max(w, 1), cpus))
        worker_fetch_s = h * hit_s + (1 - h) * (miss_s + self.storage_overhead_s)
        if w == 0:  # num_workers=0: fetch, prep and step run one after another in the main process
            cycle = 1.0 / (1.0 / compute + worker_fetch_s + 1.0 / prep)
            in_memory = 1.0 / (1.0 / compute + hit_s + 1.0 / prep)
        else:
            cycle = w / (worker_fetch_s + w / prep)
            in_memory = w / (hit_s + w / prep)  # the differential run 2: every item served from memory
        rate = min(compute, fetch, cycle)
        if rate >= compute * (1 - _TOL):
            bound = "compute"
        elif rate >= min(compute, in_memory) * (1 - _TOL):
            bound = "prep"
        else:
            bound = "fetch"
        no_fetch = min(compute, in_memory)
        per_iter = {  # the differential split: receive overhead counts as prep stall, as run 2 sees it
            "compute": b / step,
            "prep_stall": max(0.0, b / no_fetch - b / step),
            "fetch_stall": max(0.0, b / rate - b / no_fetch),
        }
        stages = {"compute": compute, "prep": prep, "fetch": fetch, "worker_cycle": cycle}
        return Prediction(rate, self.dataset_items / rate, bound, stages, h, per_iter)

    def predict_measured(self) -> Prediction:
        """The prediction at the configuration that was measured (a self-check against ``observed``)."""
        return self.predict(
            self.cache_bytes,
            self.cpus,
            self.storage_bytes_per_s,
            policy=self.cache_policy,
            workers=self.workers,
        )

    def default_axes(self) -> tuple[list[float], list[int], list[float]]:
        """Cache sizes (0..100% of the dataset and the measured one), core counts, storage speeds."""
        caches = sorted(
            {round(f * self.dataset_bytes) for f in (0, 0.25, 0.5, 0.75, 1.0)} | {round(self.cache_bytes)}
        )
        cpus = sorted({1, 2, 4, 8, 16, 32, self.cpus})
        storage = [self.storage_bytes_per_s * f for f in (0.5, 1.0, 2.0, 4.0)]
        return caches, cpus, storage

    def grid(
        self,
        cache_bytes: list[float] | None = None,
        cpus: list[int] | None = None,
        storage_bytes_per_s: list[float] | None = None,
        policies: tuple[str, ...] = POLICIES,
        gpu_speedup: float = 1.0,
    ) -> list[dict]:
        """Predictions over cache size x cores x storage speed x policy, as JSON-ready rows."""
        d_cache, d_cpus, d_storage = self.default_axes()
        rows = []
        for policy in policies:
            for cache in cache_bytes or d_cache:
                for c in cpus or d_cpus:
                    for bw in storage_bytes_per_s or d_storage:
                        p = self.predict(cache, c, bw, gpu_speedup=gpu_speedup, policy=policy)
                        rows.append(
                            {
                                "cache_bytes": cache,
                                "cpus": c,
                                "storage_bytes_per_s": bw,
                                "policy": policy,
                                "gpu_speedup": gpu_speedup,
                                "hit_ratio": p.hit_ratio,
                                "samples_per_s": p.samples_per_s,
                                "epoch_s": p.epoch_s,
                                "bound": p.bound,
                            }
                        )
        return rows

    def _reaches(self, target: float, **kw) -> bool:
        return self.predict(**kw).samples_per_s >= target * (1 - _TOL)

    def cache_bytes_for_rate(self, target: float, cpus: int, storage: float, policy: str, gpu: float = 1.0):
        """Smallest cache (bytes) that reaches ``target`` samples/s, or None when no cache does."""
        kw = {"cpus": cpus, "storage_bytes_per_s": storage, "gpu_speedup": gpu, "policy": policy}
        if not self._reaches(target, cache_bytes=self.dataset_bytes, **kw):
            return None
        lo, hi = 0.0, self.dataset_bytes
        if self._reaches(target, cache_bytes=0.0, **kw):
            return 0.0
        for _ in range(50):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if self._reaches(target, cache_bytes=mid, **kw) else (mid, hi)
        return hi

    def to_compute_bound(self, gpu_speedup: float = 1.0) -> dict:
        """How many cores, how much cache, or how fast a storage until the job is compute-bound.

        Cores: with the data in memory (prep alone). Cache: at the measured storage speed and at
        max(measured cores, cores needed). Storage: at the measured cache and policy.
        """
        target = self.compute_rate(gpu_speedup)
        cpus_needed = self.prep.cores_for_rate(target)
        cpus_for_cache = max(self.cpus, cpus_needed or self.cpus)
        cache_needed = {
            p: self.cache_bytes_for_rate(target, cpus_for_cache, self.storage_bytes_per_s, p, gpu_speedup)
            for p in POLICIES
        }
        storage_needed = None
        kw = {
            "cache_bytes": self.cache_bytes,
            "cpus": cpus_for_cache,
            "policy": self.cache_policy,
            "gpu_speedup": gpu_speedup,
        }
        if self._reaches(target, storage_bytes_per_s=1.0, **kw):
            storage_needed = 0.0  # everything hits the cache: storage speed does not matter
        elif self._reaches(target, storage_bytes_per_s=1e15, **kw):
            lo, hi = 1.0, 1e15
            for _ in range(80):  # bisection in log space: speeds span many decades
                mid = math.sqrt(lo * hi)
                lo, hi = (lo, mid) if self._reaches(target, storage_bytes_per_s=mid, **kw) else (mid, hi)
            storage_needed = hi
        return {
            "compute_samples_per_s": target,
            "gpu_speedup": gpu_speedup,
            "cpus_needed": cpus_needed,
            "cache_bytes_needed": cache_needed,
            "cache_assumes_cpus": cpus_for_cache,
            "storage_bytes_per_s_needed": storage_needed,
            # None when prep keeps scaling (JSON has no infinity)
            "prep_max_samples_per_s": self.prep.max_rate() if math.isfinite(self.prep.max_rate()) else None,
        }


def format_bytes(n: float | None) -> str:
    """Human-readable decimal size (GB = 1e9 bytes, as the CLI's --cache-gb)."""
    if n is None:
        return "-"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"

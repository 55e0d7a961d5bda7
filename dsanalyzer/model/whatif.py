"""What-if model: predict samples/s and epoch time for another cache size, core count, storage speed or GPU.

:class:`Model` holds one job's measured parameters (read from a report by
:func:`~dsanalyzer.model.measured.model_fields`) and predicts one operating point:

* ``h``, the cache hit ratio, from :mod:`~dsanalyzer.model.cache` (MinIO: the cached fraction; page
  cache: LRU under random access, far lower when the dataset does not fit);
* ``P(k)``, the prep rate on ``k`` cores, from the fitted curve of :mod:`~dsanalyzer.model.scaling`;
* the rate those give, and which stage binds, from :func:`~dsanalyzer.model.rates.compose` (the
  formula is there).

The grid of predictions and the bisections to compute-bound are :mod:`~dsanalyzer.model.search`'s.
Rates are epoch 2 on (a cold first epoch is all misses), each epoch's start included: the stages give a
steady rate, and the excess wait of an epoch's first batch the profile measured (``epoch_start_s``) is
added once per epoch (:meth:`~dsanalyzer.model.rates.Prediction.with_epoch_start`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from dsanalyzer.model import cores
from dsanalyzer.model.cache import hit_ratio
from dsanalyzer.model.measured import model_fields
from dsanalyzer.model.rates import ItemCosts, Prediction, compose
from dsanalyzer.model.scaling import PrepScaling
from dsanalyzer.model.store import StoreModel, miss_costs

__all__ = ["Model", "format_bytes"]


@dataclass(frozen=True)
class Model:
    """Measured parameters of one job, and the prediction made from them at one operating point."""

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
    batch_overhead_s: float = (
        0.0  # the main thread's own CPU per batch receiving it (in series with the step)
    )
    step_cpu_s: float | None = None  # the main process's CPU per step (None: not measured)
    prep_cpu_s: float | None = None  # CPU per sample of the data path, all processes (None: not measured)
    cpu_share: float = 1.0  # the share of its cores the job got while profiled
    job_cpu_s: float | None = None  # CPU per sample of the whole job as it ran (the real run), all processes
    in_memory_cpu_s: float | None = None  # the same in the in-memory run (no item read)
    torch_threads: int | None = None  # torch's intra-op threads in the main process while profiled
    threads_follow_cores: bool = False  # torch's default: as many intra-op threads as cores
    step_on_cpu: bool = True  # the step runs on the CPU (its intra-op threads spin between regions)
    epoch_items: int | None = None  # samples one process reads per epoch (a DistributedSampler's share)
    epoch_start_s: float = (
        0.0  # what starting an epoch costs beyond a steady batch (measured in the real run)
    )
    store: StoreModel | None = None  # an object store's fitted rates (None: files; see model/store.py)
    fetch_ahead: int = 0  # read-ahead threads per worker (coordl's fetch_ahead): the store's concurrency
    items_per_request: float = 1.0  # items one store request brings (a shard's items; 1 for loose files)

    @classmethod
    def from_report(cls, report: dict) -> Model:
        """Build the model from the measured fields of a report.json (a dict)."""
        return cls(**model_fields(report))

    @property
    def fetch_free(self) -> bool:
        """True for a dataset that reads no files: nothing to fetch, no cache or storage axis."""
        return self.avg_item_bytes == 0 and not math.isfinite(self.storage_bytes_per_s)

    @property
    def dataset_bytes(self) -> float:
        return self.dataset_items * self.avg_item_bytes

    def params(self) -> dict:
        """JSON-ready model parameters (what report.json stores under ``model``)."""
        return {
            "formula": "min(1/(1/(G*gpu_speedup) + batch_overhead_s/(a*B)), 1/(h*s/membw + (1-h)*s/storage_bw), "
            "w/(t_fetch + w/P(min(w,c))), (a*c - spin(c, w))/job_cpu_s(gpu_speedup)); "
            "over an epoch of E samples: E/(E/rate + start), start = epoch_start_s, its fill w*B/W scaled to here",
            "dataset_items": self.dataset_items,
            "epoch_items": self.epoch_items,
            "epoch_start_s": self.epoch_start_s,
            "avg_item_bytes": self.avg_item_bytes,
            "batch_size": self.batch_size,
            "compute_samples_per_s": self.compute_per_s,
            "prep_scaling": self.prep.params(),
            "storage_bytes_per_s": _finite(self.storage_bytes_per_s),  # None: the dataset reads no files
            "fetch_free": self.fetch_free,
            "storage_overhead_s": self.storage_overhead_s,
            "batch_overhead_s": self.batch_overhead_s,
            "step_cpu_s": self.step_cpu_s,
            "prep_cpu_s": self.prep_cpu_s,
            "cpu_share": self.cpu_share,
            "job_cpu_s": self.job_cpu_s,
            "in_memory_cpu_s": self.in_memory_cpu_s,
            "torch_threads": self.torch_threads,
            "threads_follow_cores": self.threads_follow_cores,
            "step_on_cpu": self.step_on_cpu,
            "mem_bandwidth_bytes_per_s": self.mem_bandwidth_bytes_per_s,
            "store": None if self.store is None else self.store.params(),
            "fetch_ahead": self.fetch_ahead,
            "items_per_request": self.items_per_request,
            "measured_at": {
                "cpus": self.cpus,
                "workers": self.workers,
                "cache_bytes": self.cache_bytes,
                "cache_policy": self.cache_policy,
            },
        }

    def compute_rate(self, gpu_speedup: float = 1.0) -> float:
        """The most samples/s the job can reach: the step plus the main process's per-batch cost."""
        own = self.batch_overhead_s / (self.cpu_share * self.batch_size)
        return 1.0 / (1.0 / (self.compute_per_s * gpu_speedup) + own)

    def cpu_per_sample(
        self, gpu_speedup: float = 1.0, policy: str | None = None, hit_ratio: float | None = None
    ) -> float | None:
        """CPU seconds per sample of the job's processes (None: not measured), with the GPU ``gpu_speedup``
        times as fast, under the cache ``policy`` with ``hit_ratio`` (default: as profiled).

        The real run's measured CPU when it ran one intra-op thread and reads through the page cache
        (every read costs its system calls, cached or not); with a MinIO cache or a bucket a miss's
        request costs CPU that a hit does not, so the in-memory run's (no read charged, as the fetch
        stage has them); else (a profile on more cores with torch's threads in it) the loader alone's
        CPU per sample plus the step's over the batch.

        A step on a GPU costs the main process CPU for as long as it lasts: CUDA's wait for the
        kernels spins (measured on an H200: 73.5 ms of CPU in a 72.6 ms step; 25.6 and 9.5 ms in the
        25.8 and 9.6 ms steps of lighter models, what ``step_cpu_s / S`` gives). So a GPU ``S`` times as
        fast leaves ``step_cpu_s / S`` of it.

        A page-cache profile predicting a MinIO cache charges the read's CPU to the misses only: its real run
        read every item, its in-memory run none, and a hit is neither (``in_memory + (1 - h) * (job -
        in_memory)``). Charging every hit the real run's CPU under-predicted the demo's fix by 15% on a
        host where the slow run's CPU per second (timers, polling) was shared by few samples.
        """
        base: float | None = None
        if (self.torch_threads or 1) <= 1:
            base = self.job_cpu_s if self.cache_policy == "pagecache" else self.in_memory_cpu_s
            if (
                policy not in (None, "pagecache")
                and self.cache_policy == "pagecache"
                and hit_ratio is not None
                and self.job_cpu_s
                and self.in_memory_cpu_s
            ):
                reads = max(self.job_cpu_s - self.in_memory_cpu_s, 0.0)
                base = self.in_memory_cpu_s + (1.0 - min(max(hit_ratio, 0.0), 1.0)) * reads
        if not base:
            base = (
                self.job_cpu_s
                if not self.prep_cpu_s
                else self.prep_cpu_s + (self.step_cpu_s or 0.0) / self.batch_size
            )
        if base and not self.step_on_cpu and self.step_cpu_s and gpu_speedup != 1.0:
            step = self.step_cpu_s / self.batch_size
            base = max(base - step * (1.0 - 1.0 / gpu_speedup), base * 1e-3)
        return base

    def spin_cores(self, cpus: int, workers: int | None = None) -> float:
        """Cores torch's idle intra-op threads hold on ``cpus`` cores beside ``workers`` busy workers."""
        threads = cores.intra_op_threads(cpus, self.torch_threads, self.threads_follow_cores)
        w = cpus if workers is None else workers
        return cores.spin_cores(cpus, self.cpu_share, w, threads, self.step_on_cpu)

    def cpu_rate(
        self, cpus: int, workers: int | None = None, gpu_speedup: float = 1.0, policy: str | None = None,
        hit_ratio: float | None = None,
    ) -> float:  # fmt: skip
        """Samples/s the job's CPU work fits in on ``cpus`` cores (infinite when it was not measured)."""
        per_sample = self.cpu_per_sample(gpu_speedup, policy, hit_ratio)
        return cores.cpu_rate(cpus, self.cpu_share, per_sample, self.spin_cores(cpus, workers))

    def in_memory_rate(self, cpus: int, gpu_speedup: float = 1.0) -> float:
        """Samples/s with every item in memory and one worker per core: fetch free, prep and step left."""
        cpu = self.cpu_rate(cpus, gpu_speedup=gpu_speedup)
        return min(self.compute_rate(gpu_speedup), self.prep.rate(cpus), cpu)

    def cores_for_rate(self, target: float, gpu_speedup: float = 1.0, max_cores: int = 4096) -> int | None:
        """Fewest cores whose in-memory rate reaches ``target`` (None: no core count does)."""
        for c in range(1, max_cores + 1):
            if self.in_memory_rate(c, gpu_speedup) >= target * (1 - 1e-9):
                return c
            if c > self.prep.peak_cores() and self.prep.rate(c) < target:
                return None
        return None

    def predict(
        self,
        cache_bytes: float,
        cpus: int,
        storage_bytes_per_s: float,
        gpu_speedup: float = 1.0,
        policy: str = "minio",
        workers: int | None = None,
        fetch_ahead: int | None = None,
        items_per_request: float | None = None,
    ) -> Prediction:
        """Predicted steady-state rate with this cache, core count, storage speed and GPU speed-up.

        ``workers`` defaults to ``cpus`` (one loader worker per core); 0 means loading in the main
        process, in series with the step. For an object store (``store``), ``storage_bytes_per_s`` is its
        aggregate bandwidth, ``fetch_ahead`` the read-ahead threads per worker and ``items_per_request``
        the items one GET brings (default: as measured).
        """
        if cpus < 1:
            raise ValueError(f"cpus must be >= 1, got {cpus}")
        if not storage_bytes_per_s or storage_bytes_per_s <= 0 or gpu_speedup <= 0:
            raise ValueError("storage_bytes_per_s and gpu_speedup must be positive")
        w = int(cpus) if workers is None else int(workers)
        if w < 0:
            raise ValueError(f"workers must be >= 0, got {w}")
        steady = self._steady(cache_bytes, cpus, storage_bytes_per_s, gpu_speedup, policy, w, fetch_ahead,
                              items_per_request)  # fmt: skip
        return steady.with_epoch_start(self.epoch_start_at(steady, w), self.epoch_items or self.dataset_items)

    def _steady(
        self, cache_bytes: float, cpus: int, storage_bytes_per_s: float, gpu_speedup: float, policy: str, w: int,
        fetch_ahead: int | None, items_per_request: float | None,
    ) -> Prediction:  # fmt: skip
        """The stages' rate between epoch starts (:meth:`predict` adds the starts)."""
        s = self.avg_item_bytes
        hit_s = s / self.mem_bandwidth_bytes_per_s if self.mem_bandwidth_bytes_per_s else 0.0
        h = hit_ratio(policy, cache_bytes / s, self.dataset_items) if s > 0 else 1.0  # s = 0: nothing read
        if self.store is not None:
            costs = self._store_costs(hit_s, storage_bytes_per_s, w, fetch_ahead, items_per_request, h)
        else:
            costs = ItemCosts(
                hit_s=hit_s, miss_s=s / storage_bytes_per_s, miss_overhead_s=self.storage_overhead_s
            )
        return compose(
            step_per_s=self.compute_per_s * gpu_speedup,
            compute_per_s=self.compute_rate(gpu_speedup),
            prep_per_s=self.prep.rate(min(max(w, 1), cpus)),
            costs=costs,
            h=h,
            workers=w,
            batch_size=self.batch_size,
            dataset_items=self.epoch_items or self.dataset_items,
            cpu_per_s=self.cpu_rate(cpus, w, gpu_speedup, policy, h),
        )

    def fill_s(self, steady: Prediction, workers: int) -> float:
        """Seconds one worker takes to make one batch at ``steady``'s operating point: ``w * B / W``, with
        ``W`` the loader's rate (fetch and worker cycle; the step not counted). An epoch's first batch
        waits that long: every worker starts its first batch at once."""
        data = min(
            steady.stage_rates.get("fetch", math.inf), steady.stage_rates.get("worker_cycle", math.inf)
        )
        if not math.isfinite(data) or data <= 0:
            return 0.0
        return max(1, workers) * self.batch_size / data

    def epoch_start_at(self, steady: Prediction, workers: int) -> float:
        """The epoch start at ``steady``'s operating point, from the one measured at the profiled one.

        The measured start is a fixed part (workers starting, ``iter()``) plus the pipeline's fill, one
        worker's first batch (:meth:`fill_s`): the fill scales with the loader's batch time there, the
        rest stays. (The demo's fetch-bound profile waits 0.8 s for its first batch at 81 samples/s; its
        cached fix fills in 50 ms: charging it the profile's start predicted the fix 59% low on an H200.)
        """
        if self.epoch_start_s <= 0:
            return 0.0
        fill_then = self._profiled_fill_s
        if fill_then <= 0:
            return self.epoch_start_s
        filled = min(self.epoch_start_s, fill_then)
        return self.epoch_start_s - filled + filled * self.fill_s(steady, workers) / fill_then

    @cached_property
    def _profiled_fill_s(self) -> float:
        """:meth:`fill_s` at the profiled operating point (once: every what-if's start scales from it)."""
        measured = self._steady(self.cache_bytes, self.cpus, self.storage_bytes_per_s, 1.0, self.cache_policy,
                                self.workers, None, None)  # fmt: skip
        return self.fill_s(measured, self.workers)

    def _store_costs(
        self, hit_s: float, bandwidth: float, workers: int, fetch_ahead: int | None, items_per_request: float | None,
        h: float,
    ) -> ItemCosts:  # fmt: skip
        """A miss from a bucket: :func:`dsanalyzer.model.store.miss_costs` at this operating point."""
        store = self.store if bandwidth == self.storage_bytes_per_s else self.store.with_bandwidth(bandwidth)
        ahead = self.fetch_ahead if fetch_ahead is None else int(fetch_ahead)
        k = self.items_per_request if items_per_request is None else float(items_per_request)
        miss_s, own_s = miss_costs(store, self.avg_item_bytes, h, workers, ahead, k, self.batch_size)
        return ItemCosts(hit_s=hit_s, miss_s=miss_s, miss_overhead_s=own_s)

    def predict_measured(self) -> Prediction:
        """The prediction at the configuration that was measured (a self-check against ``observed``)."""
        return self.predict(
            self.cache_bytes,
            self.cpus,
            self.storage_bytes_per_s,
            policy=self.cache_policy,
            workers=self.workers,
        )


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def format_bytes(n: float | None) -> str:
    """Human-readable decimal size (GB = 1e9 bytes, as the CLI's --cache-gb)."""
    if n is None:
        return "-"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"

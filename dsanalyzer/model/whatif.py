"""What-if model: predict samples/s and epoch time for another cache size, core count, storage speed or GPU.

:class:`Model` holds one job's measured parameters (read from a report by
:func:`~dsanalyzer.model.measured.model_fields`) and predicts one operating point:

* ``h``, the cache hit ratio, from :mod:`~dsanalyzer.model.cache` (MinIO: the cached fraction; page
  cache: LRU under random access, far lower when the dataset does not fit);
* ``P(k)``, the prep rate on ``k`` cores, from the fitted curve of :mod:`~dsanalyzer.model.scaling`;
* the rate those give, and which stage binds, from :func:`~dsanalyzer.model.rates.compose` (the
  formula is there), each stage's input one pure function of :mod:`~dsanalyzer.model.stages`.

The grid of predictions and the bisections to compute-bound are :mod:`~dsanalyzer.model.search`'s.
Rates are epoch 2 on (a cold first epoch is all misses), each epoch's start included: the stages give a
steady rate, and the excess wait of an epoch's first batch the profile measured (``epoch_start_s``) is
added once per epoch (:meth:`~dsanalyzer.model.rates.Prediction.with_epoch_start`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from dsanalyzer.model import cores, epoch_start, stages
from dsanalyzer.model.measured import model_fields
from dsanalyzer.model.params import JobParams, params_json
from dsanalyzer.model.rates import Prediction

__all__ = ["Model", "format_bytes"]

FORMULA = (
    "min(1/(1/(G*gpu_speedup) + batch_overhead_s/(a*B)), 1/(h*s/membw + (1-h)*s/storage_bw), "
    "w/(t_fetch + w/P(min(w,c))), (a*c - spin(c, w))/job_cpu_s(gpu_speedup)); "
    "over an epoch of E samples: E/(E/rate + start), start = epoch_start_s, its lost fill max(0, w*B/W - w*T) "
    "scaled to here"
)


@dataclass(frozen=True)
class Model(JobParams):
    """Measured parameters of one job (:class:`~dsanalyzer.model.params.JobParams`), and the prediction made
    from them at one operating point. Each stage's rate is a pure function of :mod:`~dsanalyzer.model.stages`
    (shared cores: :mod:`~dsanalyzer.model.cores`); the methods here are the questions callers ask."""

    @classmethod
    def from_report(cls, report: dict) -> Model:
        """Build the model from the measured fields of a report.json (a dict)."""
        return cls(**model_fields(report))

    def params(self) -> dict:
        """JSON-ready model parameters (what report.json stores under ``model``)."""
        return {"formula": FORMULA, **params_json(self)}

    def compute_rate(self, gpu_speedup: float = 1.0) -> float:
        """The most samples/s the job can reach: the step plus the main process's per-batch cost."""
        return stages.compute_rate(self, gpu_speedup)

    def cpu_per_sample(
        self, gpu_speedup: float = 1.0, policy: str | None = None, hit_ratio: float | None = None
    ) -> float | None:
        """CPU seconds per sample of the job's processes (None: not measured): see
        :func:`~dsanalyzer.model.cores.job_cpu_per_sample`."""
        return cores.job_cpu_per_sample(self, gpu_speedup, policy, hit_ratio)

    def spin_cores(self, cpus: int, workers: int | None = None) -> float:
        """Cores torch's idle intra-op threads hold on ``cpus`` cores beside ``workers`` busy workers."""
        return cores.job_spin_cores(self, cpus, workers)

    def cpu_rate(
        self, cpus: int, workers: int | None = None, gpu_speedup: float = 1.0, policy: str | None = None,
        hit_ratio: float | None = None,
    ) -> float:  # fmt: skip
        """Samples/s the job's CPU work fits in on ``cpus`` cores (infinite when it was not measured)."""
        return cores.job_cpu_rate(self, cpus, workers, gpu_speedup, policy, hit_ratio)

    def in_memory_rate(self, cpus: int, gpu_speedup: float = 1.0) -> float:
        """Samples/s with every item in memory and one worker per core: fetch free, prep and step left."""
        return stages.in_memory_rate(self, cpus, gpu_speedup)

    def cores_for_rate(self, target: float, gpu_speedup: float = 1.0, max_cores: int = 4096) -> int | None:
        """Fewest cores whose in-memory rate reaches ``target`` (None: no core count does)."""
        return stages.cores_for_rate(self, target, gpu_speedup, max_cores)

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
        point = stages.Point(cache_bytes, cpus, storage_bytes_per_s, gpu_speedup, policy, w, fetch_ahead,
                             items_per_request)  # fmt: skip
        return self._at(point)

    def _at(self, point: stages.Point) -> Prediction:
        steady = stages.steady(self, point)
        return steady.with_epoch_start(
            self.epoch_start_at(steady, point.workers), self.epoch_items or self.dataset_items
        )

    def epoch_start_at(self, steady: Prediction, workers: int) -> float:
        """The epoch start at ``steady``'s operating point, from the one measured at the profiled one
        (:func:`~dsanalyzer.model.epoch_start.epoch_start_at`)."""
        return epoch_start.epoch_start_at(self, steady, workers, self._start_split)

    @cached_property
    def _start_split(self) -> epoch_start.Split:
        """The measured epoch start's fixed part and fill (once: every what-if scales from it)."""
        return epoch_start.split(self)

    def predict_measured(self) -> Prediction:
        """The prediction at the configuration that was measured (a self-check against ``observed``): its
        reads charged the CPU they cost in the real run, which began with the dataset evicted."""
        return self._at(stages.measured_point(self))


def format_bytes(n: float | None) -> str:
    """Human-readable decimal size (GB = 1e9 bytes, as the CLI's --cache-gb)."""
    if n is None:
        return "-"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"

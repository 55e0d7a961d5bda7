"""The rate composition: a job's samples/s from its stages' rates, and which stage binds.

The job is a pipeline of stages and runs at the rate of its slowest one (Plumber-style rate model)::

    observed = min(1/(1/(G * gpu_speedup) + r/(a B)),   compute: the step plus the main process's own receive work
                   F(h, storage),                       fetch: the storage device and memory bus, shared by all workers
                   W(workers, cores, h),                worker cycle: each worker fetches *then* preps its items
                   C(cores))                            cpu: every process of the job sharing the cores

* Fetch stage, aggregate over all workers: ``F = 1 / (h * s / membw + (1 - h) * s / storage_bw)`` items/s,
  with ``s`` the mean item size, ``membw`` the measured memory bandwidth and ``storage_bw`` the measured
  (or asked) storage bandwidth. The storage bandwidth is a property of the device, shared by the
  parallel fetch streams of the workers, so it is *not* multiplied by the worker count.
* Worker cycle: a DataLoader worker reads an item and then preps it; its own read latency is not
  overlapped with its own prep. With ``w`` workers on ``c`` cores each item costs a worker
  ``t_fetch = h * s / membw + (1 - h) * (s / storage_bw + overhead_s)`` plus ``w / P(min(w, c))`` of prep,
  so ``W = w / (t_fetch + w / P(min(w, c)))``. With a free fetch this is the prep rate P.
  This term is why adding workers helps a latency-bound fetch even when the device is not saturated.
* Shared cores: every sample costs the job's processes CPU, ``prep_cpu_s`` in the data path (the
  workers, and the main process receiving) plus ``step_cpu_s / B`` of the main process's own step
  work (its host side; all of a CPU step). ``c`` cores, of which the job gets the share ``a`` that
  the profile measured, run at most ``C = a * c / (prep_cpu_s + step_cpu_s / B)`` samples/s, less
  the cores torch's spinning intra-op threads hold (:mod:`~dsanalyzer.model.cores`). On a
  GPU the step leaves the cores to prep and ``C`` is about ``P(c)``; on a small machine with a CPU
  step the main process takes a core from the workers and ``C`` binds: that is prep stall (more
  cores raise it), not a fixed cost of the main process.
* Epoch start: a new epoch's first batch waits longer than a steady one (``iter(loader)`` starts
  workers, the pipeline is empty). The profile measures the excess, ``epoch_start_s``, and an epoch of
  ``E`` samples takes ``E / rate + epoch_start_s``: what the observed rate (samples over the whole
  time) shows and the stages' steady rates do not (:meth:`Prediction.with_epoch_start`); its fill,
  one worker's first batch, moves with the operating point (``Model.epoch_start_at``). Bounds are
  judged on the steady rate.
* Main process: it receives each batch (``batch_overhead_s`` of its own CPU) and runs the step one
  after the other, so the job never exceeds ``B / (B/G + batch_overhead_s / a)``: the compute
  bound. Only its own work counts here; waiting for workers and losing its core to them do not.

``bound`` follows the differential definition: compute when the prediction equals the compute rate,
prep when it equals the in-memory pipeline rate (prep stall = its gap to compute), fetch otherwise
(fetch stall = the rest). The hit ratio ``h`` and the prep rate ``P`` come in as numbers: the cache
model (:mod:`~dsanalyzer.model.cache`) and the prep curve (:mod:`~dsanalyzer.model.scaling`) give them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

__all__ = ["Prediction", "ItemCosts", "compose"]

TOL = 1e-6  # a rate within this fraction of a stage's rate is bound by that stage


@dataclass(frozen=True)
class Prediction:
    """A predicted operating point: rate, epoch time, binding stage and every stage's rate."""

    samples_per_s: float
    epoch_s: float
    bound: str
    stage_rates: dict = field(default_factory=dict)
    hit_ratio: float = 0.0
    per_iter_s: dict = field(default_factory=dict)
    steady_per_s: float | None = None  # the rate between epoch starts (None: ``samples_per_s``, none charged)

    @property
    def steady(self) -> float:
        """Samples/s between epoch starts: what the stages allow, the rate bounds are judged on."""
        return self.samples_per_s if self.steady_per_s is None else self.steady_per_s

    def with_epoch_start(self, epoch_start_s: float, epoch_items: int) -> Prediction:
        """This steady rate with ``epoch_start_s`` lost at the start of every epoch of ``epoch_items``."""
        if (
            not epoch_start_s
            or epoch_start_s <= 0
            or epoch_items <= 0
            or not math.isfinite(self.samples_per_s)
        ):
            return self
        steady_epoch_s = epoch_items / self.samples_per_s
        epoch_s = steady_epoch_s + epoch_start_s
        return replace(
            self, samples_per_s=epoch_items / epoch_s, epoch_s=epoch_s, steady_per_s=self.samples_per_s
        )


@dataclass(frozen=True)
class ItemCosts:
    """Seconds one item costs to fetch: from memory (a hit), from storage (a miss), plus a miss's latency."""

    hit_s: float
    miss_s: float
    miss_overhead_s: float = 0.0

    def aggregate_s(self, h: float) -> float:
        """The fetch stage's seconds per item over all workers: bandwidth only (latencies overlap)."""
        return h * self.hit_s + (1 - h) * self.miss_s

    def worker_s(self, h: float) -> float:
        """One worker's seconds per item fetched: its own latency is not hidden behind its own prep."""
        return h * self.hit_s + (1 - h) * (self.miss_s + self.miss_overhead_s)


def compose(
    *,
    step_per_s: float,
    compute_per_s: float,
    prep_per_s: float,
    costs: ItemCosts,
    h: float,
    workers: int,
    batch_size: int,
    dataset_items: int,  # samples per epoch (of this process): for epoch_s
    cpu_per_s: float = math.inf,
) -> Prediction:
    """The predicted rate of ``workers`` loader workers at hit ratio ``h`` (0 workers: all in the main process).

    ``step_per_s`` is the step alone (G x speed-up), ``compute_per_s`` the step with the main process's
    per-batch cost; ``prep_per_s`` the prep rate at this worker count on these cores; ``cpu_per_s``
    the rate the job's CPU work fits in on these cores (``C``; infinite when not measured).
    """
    fetch_s = costs.aggregate_s(h)
    fetch = math.inf if fetch_s <= 0 else 1.0 / fetch_s
    worker_fetch_s = costs.worker_s(h)
    if workers == 0:  # num_workers=0: fetch, prep and step run one after another in the main process
        cycle = 1.0 / (1.0 / compute_per_s + worker_fetch_s + 1.0 / prep_per_s)
        in_memory = 1.0 / (1.0 / compute_per_s + costs.hit_s + 1.0 / prep_per_s)
    else:
        cycle = min(cpu_per_s, workers / (worker_fetch_s + workers / prep_per_s))
        # the differential run 2: items from memory
        in_memory = min(cpu_per_s, workers / (costs.hit_s + workers / prep_per_s))
    rate = min(compute_per_s, fetch, cycle)
    no_fetch = min(compute_per_s, in_memory)
    if rate >= compute_per_s * (1 - TOL):
        bound = "compute"
    elif rate >= no_fetch * (1 - TOL):
        bound = "prep"
    else:
        bound = "fetch"
    b = batch_size
    per_iter = {  # the differential split: receive overhead counts as prep stall, as run 2 sees it
        "compute": b / step_per_s,
        "prep_stall": max(0.0, b / no_fetch - b / step_per_s),
        "fetch_stall": max(0.0, b / rate - b / no_fetch),
    }
    stages = {
        "compute": compute_per_s,
        "prep": prep_per_s,
        "fetch": fetch,
        "worker_cycle": cycle,
        "cpu": cpu_per_s,
    }
    return Prediction(rate, dataset_items / rate, bound, stages, h, per_iter)

"""Coordinated prep (``coordinate=``, ``whatif --jobs K``): K jobs over one dataset share one fetch+prep per batch.

With ``coordl.DataLoader(..., coordinate="group")`` every job starts ``max(1, w)`` producer processes;
together they fetch and prep each batch of the group once and write it into a ring of shared-memory
slots, and every job reads every batch (:mod:`coordl.coordinated`). On ``c`` cores, with ``K`` jobs of
``w`` workers each, each job runs at::

    per job = min( 1/(1/(G*gpu_speedup) + r_shared/(a*B)),     its own step and decoding a shared batch
                   F(h),                                       fetch: each item read once for the group
                   n/(t_fetch + n/P(min(n, c))),  n = K*max(1, w) producers
                   (a*c - spin_K) / (d + K*o) )                shared cores

* ``d`` is the data path's CPU per sample (producers: fetch, prep, collate, encode), paid once for the
  group: the job's measured CPU per sample less its own part, ``o = step_cpu_s/B + receive/B``, which
  every job pays (``r_shared``, the CPU to decode one batch out of its slot, measured by the profile's
  probe; the pipe's ``batch_overhead_s`` when it was not);
* ``a`` is the share other processes leave (the producers have no torch pipeline gaps, :func:`_gapless`), and
  the producers' prep curve ``P`` is scaled by it over the profiled loader's share;
* ``spin_K``: the cores the K main processes' idle intra-op threads hold (:mod:`~dsanalyzer.model.cores`),
  each runnable for the share of the time its host's spin keeps it so at its job's batch rate;
* the aggregate is ``K x per job``; the memory the group holds is its ring, ``slots x 1.05 x`` one encoded
  batch (``coordl.coordinated.job.Group``: 8 slots, each the probe batch's size plus 5%).

No epoch start is charged: the producers outlive the epochs and keep the ring full across them.
Compared with K jobs that each prep every item (:attr:`Coordinated.uncoordinated`): the same stages for
K times the samples (prep and fetch once per job), a K-th of it each, the measured epoch start charged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsanalyzer.model import cores, epoch_start, stages
from dsanalyzer.model.params import JobParams
from dsanalyzer.model.rates import Prediction, compose
from dsanalyzer.model.remedy import Remedy

__all__ = ["Coordinated", "DEFAULT_SLOTS", "coordinated", "group_memory_bytes", "remedy"]

DEFAULT_SLOTS = 8  # coordl.coordinated.job.Group's staging slots (tests check they agree)
SLOT_MARGIN = 1.05  # a slot is the probe batch's encoded size plus 5% (coordl.coordinated.group)


@dataclass(frozen=True)
class Coordinated:
    """K coordinated jobs at one operating point: each job's rate, K independent jobs' for comparison."""

    jobs: int
    producers: int
    per_job: Prediction
    uncoordinated: Prediction  # each of K jobs that prep every item themselves
    memory_bytes: float | None  # the group's ring (None: the batch's size was not measured)

    @property
    def aggregate_per_s(self) -> float:
        return self.jobs * self.per_job.samples_per_s


def group_memory_bytes(job: JobParams, slots: int = DEFAULT_SLOTS) -> float | None:
    """Bytes the group's ring holds in shared memory (``slots`` slots of one encoded batch plus 5%)."""
    return None if not job.shared_batch_bytes else slots * math.ceil(job.shared_batch_bytes * SLOT_MARGIN)


def _cpu_parts(
    job: JobParams, g: float, policy: str, h: float, receive_s: float
) -> tuple[float, float] | None:
    """(data path's CPU per sample, one job's own CPU per sample) at GPU speed-up ``g``; None: not measured."""
    total = cores.job_cpu_per_sample(job, g, policy, h)
    if not total:
        return None
    step = (job.step_cpu_s or 0.0) / job.batch_size
    if not job.step_on_cpu and g != 1.0:
        step /= g  # CUDA's wait for the kernels spins for as long as the step lasts (model/cores.py)
    data = max(total - step - job.batch_overhead_s / job.batch_size, total * 1e-3)
    return data, step + receive_s / job.batch_size


def _spin(job: JobParams, cpus: int, producers: int, jobs: int) -> float:
    """Cores the K main processes' idle intra-op threads hold beside the busy producers."""
    threads = cores.intra_op_threads(cpus, job.torch_threads, job.threads_follow_cores)
    if threads <= 1 or not job.step_on_cpu:
        return 0.0
    helpers = jobs * (threads - 1)
    return helpers * min(1.0, job.cpu_share * cpus / (producers + helpers))


def _gapless(job: JobParams) -> float:
    """How much more of the cores the producers keep busy than the profiled loader's workers did.

    The profile's share ``a`` holds torch's pipeline gaps as well as other processes' load (0.915 of 2
    cores on the VM with 0.02 cores taken by others); the producers fill a ring and never wait on a
    consumer while the jobs are prep-bound, so they get what other processes leave (``free_share``).
    Measured on the 2-core VM (2026-11-28): 406.9 samples/s per job where the share ``a`` predicted 368.1
    (+10.5%) and ``free_share`` 407."""
    if job.free_share is None or job.cpu_share <= 0:
        return 1.0
    return max(1.0, job.free_share / job.cpu_share)


def coordinated(job: JobParams, jobs: int, point: stages.Point | None = None) -> Coordinated:
    """``jobs`` coordinated jobs at ``point`` (default: as measured), each with ``point.workers`` workers."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    p = point or stages.point_at(job)
    c, g, b, w = p.cpus, p.gpu_speedup, job.batch_size, max(1, p.workers)
    n = jobs * w
    h = stages.cache_hit_ratio(job, p.policy, p.cache_bytes)
    receive = job.shared_receive_s if job.shared_receive_s is not None else job.batch_overhead_s
    costs = stages.fetch_costs(job, p, h)
    parts = _cpu_parts(job, g, p.policy, h, receive)
    have, most, runnable = job.cpu_share * c, _spin(job, c, n, jobs), cores.runnable_s_per_batch(job)
    gapless = _gapless(job)
    cpu = (
        math.inf
        if parts is None
        else cores.solve_cpu_rate(have * gapless, parts[0] + jobs * parts[1], most, runnable, b)[0]
    )
    items = job.epoch_items or job.dataset_items
    own = 1.0 / (1.0 / (job.compute_per_s * g) + receive / (job.cpu_share * b))
    prep = stages.prep_rate(job, n, c)
    shared = compose(step_per_s=job.compute_per_s * g, compute_per_s=own, prep_per_s=prep * gapless, costs=costs, h=h,
                     workers=n, batch_size=b, dataset_items=items, cpu_per_s=cpu)  # fmt: skip
    # K independent jobs: the stages for K times the samples, each job a K-th (one job: the plain prediction)
    plain = _cpu_parts(job, g, p.policy, h, job.batch_overhead_s)
    cpu_k = (
        math.inf
        if plain is None
        else cores.solve_cpu_rate(have, jobs * (plain[0] + plain[1]), most, runnable, b)[0]
    )
    step_k = stages.compute_rate(job, g)
    alone = compose(step_per_s=job.compute_per_s * g, compute_per_s=jobs * step_k, prep_per_s=prep, costs=costs,
                    h=h, workers=n, batch_size=b, dataset_items=items * jobs, cpu_per_s=jobs * cpu_k)  # fmt: skip
    each = Prediction(alone.samples_per_s / jobs, alone.epoch_s, alone.bound,
                      {k: v / jobs for k, v in alone.stage_rates.items()}, h, alone.per_iter_s)  # fmt: skip
    each = epoch_start.with_start(job, each, p.workers)
    return Coordinated(jobs, n, shared, each, group_memory_bytes(job))


def remedy(job: JobParams, jobs: int, point: stages.Point | None = None, group: str = "job-group") -> Remedy:
    """Coordinated prep as a :class:`~dsanalyzer.model.remedy.Remedy`: each job's rate, the jobs and ring memory."""
    if not job.shared_batch_bytes:
        why = job.coordinate_why or "the shared batch was not measured"
        return Remedy("coordinate", None, cost={"jobs": jobs}, why_unknown=why)
    pred = coordinated(job, jobs, point)
    return Remedy(
        "coordinate",
        pred.per_job.samples_per_s,
        bound=pred.per_job.bound,
        cost={"jobs": jobs, "memory_bytes": pred.memory_bytes},
        loader_args={"coordinate": group},
        note=(
            f"start the {jobs} jobs with the same dataset, batch_size, shuffle and drop_last; together "
            f"{pred.aggregate_per_s:.1f} samples/s against {jobs * pred.uncoordinated.samples_per_s:.1f} uncoordinated"
        ),
    )

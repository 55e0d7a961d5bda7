"""The shared-cores stage: how many samples/s the job's CPU work fits in on ``c`` cores.

Every sample costs the job's processes CPU: the workers' prep and the main process's receive and
step. On ``c`` cores, of which the job gets the share ``a`` (other processes hold the rest), the job
runs at most ``C = (a * c - spin) / cpu_per_sample`` samples/s, where

* ``cpu_per_sample`` is measured in the real run (the whole job, workers and main process
  together, CPU time over samples), so it carries what running beside the step costs the workers
  (caches, the receive path) and what reading the files costs (open, read: 0.1 ms a sample for the
  README's job, which the in-memory runs do not pay); a profile without it falls back to the
  loader-alone run's CPU per sample plus the step's CPU over the batch. A step on a GPU costs the main
  process CPU for as long as it lasts (CUDA's wait for the kernels spins), so with a GPU ``S`` times
  as fast that part is ``step_cpu_s / S`` (:func:`job_cpu_per_sample`);
* ``spin`` is the cores torch's idle intra-op threads hold. With a CPU step and torch's default
  thread count, the main process runs ``T = c`` intra-op threads (the count follows the affinity
  mask). Between parallel regions OpenMP's idle threads spin before they sleep (measured here: about
  8 ms of CPU after each region; a step is dozens of regions), so while the workers keep every core
  busy each of the ``T - 1`` helpers is one more runnable thread, and the scheduler gives each of
  the ``w + T - 1`` runnable threads (the workers and the helpers; the main thread mostly waits for
  its batch) the same share of the ``a * c`` cores, at most one core each. ``spin = (T - 1) *
  min(1, a * c / (w + T - 1))``. None when the step runs on a GPU (no CPU parallel regions to
  spin after), when the script fixed its thread count (``torch.set_num_threads``,
  ``OMP_NUM_THREADS``), or with one thread.

Measured on the 2-core VM (reports/bench_whatif.md, session 11): torch's second thread cost the
README's job 17-20 ms of CPU per batch of 32 beside its workers (0.57-0.71 of a core), against 0.65
(two workers) and 0.97 (one worker) from the share above.

That share is what a helper holds when it is runnable throughout, and how long it stays runnable is a
property of the host: OpenMP spins a fixed count of pause instructions, 3.4-5 ms on the Intel Xeon VM and
0.7 ms with a tenth of the count (``GOMP_SPINCOUNT=30000``), under which the README's job ran 25-35%
faster on 2 cores (reports/bench_whatif.md, 2026-11-28). So the share is scaled by ``u``, the fraction of
the time a helper is runnable: per batch it works through the step (``step_cpu_s``) and then spins
``D`` (the host's spin, :mod:`dsanalyzer.measure.ompspin`) once when the step ends and once each time
the main thread loses its core mid-step and leaves it waiting at a region's barrier
(``main_preempts_per_batch``, counted in the real run)::

    u = min(1, (step_cpu_s + (1 + preempts) * D) * rate / B)

``u`` depends on the rate and the rate on the cores left, so ``C`` solves ``C * cpu_per_sample = a * c -
spin_max * u(C)`` (:func:`solve_cpu_rate`: a straight line below saturation, the full share above it).
Without a measured ``D`` the helper is charged as runnable throughout (``u = 1``), the bound it was before.
On the VM the fit holds across the spin counts: at ``D`` = 0.74 ms it charges 0.23 cores where the
helper took 0.22 (5.2 ms per batch at 43 batches/s); at 4 ms the helper is runnable throughout.
"""

from __future__ import annotations

import math

from dsanalyzer.model.params import JobParams

__all__ = [
    "worker_cpu_s",
    "intra_op_threads",
    "spin_cores",
    "solve_cpu_rate",
    "runnable_s_per_batch",
    "cpu_rate",
    "job_cpu_per_sample",
    "job_spin_cores",
    "job_cpu_rate",
]


def intra_op_threads(cpus: int, measured: int | None, follow_cores: bool) -> int:
    """torch's intra-op threads on ``cpus`` cores: the count follows the cores unless the script fixed it."""
    if follow_cores:
        return max(1, int(cpus))
    return max(1, int(measured or 1))


def spin_cores(cpus: int, share: float, workers: int, threads: int, step_on_cpu: bool = True) -> float:
    """Cores that ``threads - 1`` spinning intra-op helpers hold beside ``workers`` busy workers."""
    if threads <= 1 or workers <= 0 or not step_on_cpu:
        return 0.0
    runnable = workers + threads - 1
    per_thread = min(1.0, share * cpus / runnable)
    return (threads - 1) * per_thread


def solve_cpu_rate(
    cores_: float,
    cpu_per_sample: float | None,
    spin_max: float,
    runnable_s_per_batch: float | None,
    batch: int,
) -> tuple[float, float]:
    """(``C``, the spin it leaves): ``C * cpu_per_sample = cores_ - spin_max * min(1, r * C / B)``, with
    ``r`` the helper's runnable seconds per batch (None: runnable throughout)."""
    if not cpu_per_sample or cpu_per_sample <= 0:
        return math.inf, spin_max
    saturated = max(0.0, cores_ - spin_max) / cpu_per_sample
    if runnable_s_per_batch is None or spin_max <= 0:
        return saturated, spin_max
    below = cores_ / (cpu_per_sample + spin_max * runnable_s_per_batch / max(1, batch))
    if below * runnable_s_per_batch / max(1, batch) >= 1.0:
        return saturated, spin_max
    return below, spin_max * below * runnable_s_per_batch / max(1, batch)


def cpu_rate(cpus: int, share: float, cpu_per_sample: float | None, spin: float = 0.0) -> float:
    """``C``: samples/s the job's CPU work fits in on ``cpus`` cores (infinite when not measured)."""
    if not cpu_per_sample or cpu_per_sample <= 0:
        return math.inf
    return max(0.0, share * cpus - spin) / cpu_per_sample


def job_cpu_per_sample(
    job: JobParams, gpu_speedup: float = 1.0, policy: str | None = None, hit_ratio: float | None = None
) -> float | None:
    """CPU seconds per sample of the job's processes (None: not measured), with the GPU ``gpu_speedup``
    times as fast, under the cache ``policy`` with ``hit_ratio`` (default: as profiled).

    The real run's measured CPU when it ran one intra-op thread, as the job predicted does (``cpu_threads``:
    a run with more holds their spin; one thread predicted from it was capped at 911 samples/s where it
    measured 1,630 with 2 workers, bench_fix's prep job, 2026-11-29), and reads through the page cache
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
    measured_with = job.cpu_threads if job.cpu_threads is not None else job.torch_threads
    if (job.torch_threads or 1) <= 1 and (measured_with or 1) <= 1:
        base = job.job_cpu_s if job.cache_policy == "pagecache" else job.in_memory_cpu_s
        if (
            job.cache_policy == "pagecache"
            and hit_ratio is not None
            and job.job_cpu_s
            and job.in_memory_cpu_s
        ):
            reads = max(job.job_cpu_s - job.in_memory_cpu_s, 0.0)
            h = min(max(hit_ratio, 0.0), 1.0)
            if policy not in (None, "pagecache"):
                base = job.in_memory_cpu_s + (1.0 - h) * reads
            else:
                base = job.in_memory_cpu_s + page_cache_reads_s(job, reads, h)
    if not base:
        base = (
            job.job_cpu_s if not job.prep_cpu_s else job.prep_cpu_s + (job.step_cpu_s or 0.0) / job.batch_size
        )
    if base and not job.step_on_cpu and job.step_cpu_s and gpu_speedup != 1.0:
        step = job.step_cpu_s / job.batch_size
        base = max(base - step * (1.0 - 1.0 / gpu_speedup), base * 1e-3)
    return base


def runnable_s_per_batch(job: JobParams) -> float | None:
    """A helper's runnable seconds per batch: the step, then a spin at its end and at each preemption."""
    if job.omp_spin_s is None:
        return None
    return (job.step_cpu_s or 0.0) + (1.0 + (job.main_preempts_per_batch or 0.0)) * job.omp_spin_s


def _most(job: JobParams, cpus: int, workers: int | None) -> float:
    """The cores the job's helpers hold when runnable throughout (``workers`` default: one per core)."""
    threads = intra_op_threads(cpus, job.torch_threads, job.threads_follow_cores)
    w = cpus if workers is None else workers
    return spin_cores(cpus, job.cpu_share, w, threads, job.step_on_cpu)


def job_spin_cores(
    job: JobParams, cpus: int, workers: int | None = None, cpu_per_sample: float | None = None
) -> float:
    """Cores the job's idle intra-op threads hold on ``cpus`` cores beside ``workers`` busy workers
    (default: one per core), at the rate its CPU work then fits in (``cpu_per_sample``: the job's)."""
    per_sample = job_cpu_per_sample(job) if cpu_per_sample is None else cpu_per_sample
    most, runnable = _most(job, cpus, workers), runnable_s_per_batch(job)
    _, spin = solve_cpu_rate(job.cpu_share * cpus, per_sample, most, runnable, job.batch_size)
    return spin


def job_cpu_rate(
    job: JobParams, cpus: int, workers: int | None = None, gpu_speedup: float = 1.0,
    policy: str | None = None, hit_ratio: float | None = None,
) -> float:  # fmt: skip
    """``C`` for this job: samples/s its CPU work fits in on ``cpus`` cores (infinite when not measured)."""
    per_sample = job_cpu_per_sample(job, gpu_speedup, policy, hit_ratio)
    most, runnable = _most(job, cpus, workers), runnable_s_per_batch(job)
    rate, _ = solve_cpu_rate(job.cpu_share * cpus, per_sample, most, runnable, job.batch_size)
    return rate


def page_cache_reads_s(job: JobParams, reads: float, h: float) -> float:
    """CPU seconds per sample of a page-cache job's reads at hit ratio ``h``: ``h * warm + (1 - h) * cold``.

    ``reads`` is what the real run's reads cost (its CPU per sample over the in-memory run's); that run
    began with the dataset evicted, so its reads were cold but for ``real_read_hit_ratio`` of them. A
    cold read costs the page cache's fill too: on the 2-core Intel VM (2026-11-28) a 90 KB JPEG cost
    0.08-0.13 ms of CPU cold and 0.03-0.045 ms cached, and the README job's profiles on one core read
    0.16-0.26 ms a sample more than their in-memory run. Charged at every hit ratio, that put the
    what-if at 2 cores, whose runs read the cached dataset, 5-19% below them. ``reads`` as measured
    where the warm read was not (older reports) or the run did not begin cold."""
    warm, h0 = job.warm_read_cpu_s, job.real_read_hit_ratio
    if warm is None or h0 is None or h0 >= 1.0:
        return reads
    warm = min(warm, reads)
    cold = (reads - h0 * warm) / (1.0 - h0)
    return h * warm + (1.0 - h) * cold


def worker_cpu_s(job: JobParams) -> float:
    """A worker's CPU seconds per sample on a core of its own: the loader alone's CPU per sample less the
    main process's receive (``prep_cpu_s - batch_overhead_s / B``, at least 5% of it); ``1 / P(1)`` where not
    measured. What a sample cache's hit saves from (:mod:`~dsanalyzer.model.sample_cache`) and what a remote
    CPU spends (:mod:`~dsanalyzer.model.remote_prep`); not ``1 / P(1)`` when measured, because the worker
    measured for ``P(1)`` shares its core with the main process (2-core Intel VM, 2026-11-28: ``P(1)`` 823
    samples/s where this gives 1.09 ms, and the same prep alone on a core of its own took 1.04 ms)."""
    if job.prep_cpu_s:
        return max(job.prep_cpu_s - job.batch_overhead_s / max(1, job.batch_size), job.prep_cpu_s * 0.05)
    return 1.0 / job.prep.rate(1)

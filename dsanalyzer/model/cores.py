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
  as fast that part is ``step_cpu_s / S`` (``Model.cpu_per_sample``);
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
(two workers) and 0.97 (one worker) from the share above. Validated at 2 cores only; on many cores
a step with few parallel regions leaves its helpers asleep most of each batch, and the charge above
is then an upper bound.
"""

from __future__ import annotations

import math

__all__ = ["intra_op_threads", "spin_cores", "cpu_rate"]


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


def cpu_rate(cpus: int, share: float, cpu_per_sample: float | None, spin: float = 0.0) -> float:
    """``C``: samples/s the job's CPU work fits in on ``cpus`` cores (infinite when not measured)."""
    if not cpu_per_sample or cpu_per_sample <= 0:
        return math.inf
    return max(0.0, share * cpus - spin) / cpu_per_sample

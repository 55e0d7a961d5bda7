"""What an epoch measured, and the rate a change of the loader's knobs would give: pure functions.

An epoch is measured in its steady part (after the workers' first round): the items, the wall time, the
time the training loop spent waiting inside ``next()`` (the data stall), and the CPU of the main process
and of the workers. From those:

* the trainer's own time per item, ``t_c = (wall - wait + receive) / items`` (``receive``: the loop's CPU
  inside ``next()`` taking a batch that was ready): the rate can never pass ``1 / t_c``;
* the workers' CPU per item ``c_w``; ``W`` workers on the cores the main process leaves them prep at
  ``min(W, cores - main) / c_w`` items per second (a worker that waits on storage does not count its wait
  in ``c_w``: such a job is fetch-bound, and more reads in flight, one per worker, not more cores, is what
  helps; ``prefetch_factor`` adds none: a worker makes one batch at a time);
* the rate of the loop is the slower of the two. A prediction is that model at the new knobs, scaled by
  what the model gave at the measured knobs against what was measured (the pipeline's own losses cancel).

The same functions serve ``coordl.DataLoader(tune=True)`` between epochs, and any tool that wants a
loader's rate at other knobs without running it (coordl never imports dsanalyzer; dsanalyzer may import
this). Each prediction is checked by the next epoch: the tuner keeps a change only if it measured better.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = [
    "EpochMeasure",
    "Knobs",
    "contended",
    "data_bound",
    "merged",
    "oversubscribed",
    "predict_rate",
    "prep_rate",
    "storage_bound",
]

# a data stall below this share of the loop's time is noise, not a bound (the trainer's own time binds)
STALL_SHARE_BOUND = 0.05
# a worker busy on its CPU for less than this share of the epoch waits on storage, not on its core
WORKER_BUSY_PREP_BOUND = 0.6
# a main process on fewer cores than this while the loop runs its step waits on an accelerator (or sleeps)
STEP_ON_CPU = 0.1
# the model missed the measured rate by more than this: the pipeline loses to bursts a deeper queue may absorb
QUEUE_LOSS = 0.15
# this share of the cores idle over a window: nothing waits for a core, so nothing contends for one
IDLE_CORES_FREE = 0.25


@dataclass(frozen=True)
class Knobs:
    """The settings a loader can change between epochs."""

    num_workers: int
    prefetch_factor: int
    intra_op_threads: int


@dataclass(frozen=True)
class EpochMeasure:
    """One epoch's steady part, as measured in the main process.

    Attributes:
        items: items handed out in the measured window.
        wall_s: the window's wall time.
        wait_s: of it, the time the loop spent inside ``next()`` on the loader.
        main_cpu_s: the main process's CPU in the window (every thread: the trainer's intra-op threads too).
        workers_cpu_s: the workers' CPU in the window.
        knobs: the settings the epoch ran with.
        cores: the CPUs this process may run on.
        receive_cpu_s: of ``wait_s``, the loop's own thread's CPU inside ``next()``: receiving a batch that
            was ready (torch's unpickling and descriptor passing), not waiting for one. No loader knob
            shortens it, so it is neither a stall nor the step's CPU. (On the 2-core VM a ready batch's
            ``next()`` took 4 ms after a 100 ms step and 20-40 ms of CPU after a 300 ms one, torch's own
            loader alike: a sleeping trainer looked 10% data-bound and got a trial.)
        idle_cores: the cores (of those this process may run on) the host left idle over the window, on
            average, whoever's work took the rest (None: not measured). Cores left idle are cores nobody
            waited for: the trainer's threads and the workers did not contend for them.
    """

    items: int
    wall_s: float
    wait_s: float
    main_cpu_s: float
    workers_cpu_s: float
    knobs: Knobs
    cores: int
    receive_cpu_s: float = 0.0
    idle_cores: float | None = None

    @property
    def rate(self) -> float:
        return self.items / self.wall_s

    @property
    def stall_share(self) -> float:
        """The share of the window the loop waited for a batch (receiving a ready one is not waiting)."""
        return max(self.wait_s - self.receive_cpu_s, 0.0) / self.wall_s

    @property
    def compute_s_per_item(self) -> float:
        """The loop's own time per item: its step, and receiving each batch (no knob of the loader's removes it)."""
        return max(self.wall_s - self.wait_s + self.receive_cpu_s, 0.0) / self.items

    @property
    def worker_cpu_s_per_item(self) -> float:
        return self.workers_cpu_s / self.items

    @property
    def main_cores(self) -> float:
        return self.main_cpu_s / self.wall_s

    @property
    def step_cpu_share(self) -> float:
        """The main process's cores while the loop ran its own code (not waiting on the loader): its CPU but
        the loop's thread's inside ``next()``, over the time outside it (idle intra-op threads that spin
        while the loop waits count: they take cores as the step would)."""
        return max(self.main_cpu_s - self.receive_cpu_s, 0.0) / max(self.wall_s - self.wait_s, 1e-9)

    @property
    def workers_busy(self) -> float:
        """Each worker's share of the window on its CPU (1: always computing)."""
        return self.workers_cpu_s / (self.wall_s * max(1, self.knobs.num_workers))


def storage_bound(m: EpochMeasure) -> bool:
    """Whether the workers wait on storage rather than on a core: they are off their CPU most of the time
    while the host's cores are not all taken (workers starved by a trainer's spinning threads look idle too)."""
    used = m.main_cores + m.workers_cpu_s / m.wall_s
    return m.knobs.num_workers > 0 and m.workers_busy < WORKER_BUSY_PREP_BOUND and used < 0.9 * m.cores


def data_bound(m: EpochMeasure) -> bool:
    """Whether the loop waited on the loader long enough for a loader change to matter."""
    return m.stall_share >= STALL_SHARE_BOUND


def oversubscribed(intra_op_threads: int, num_workers: int, cores: int) -> bool:
    """Whether the trainer's intra-op threads and the loader's workers outnumber the cores.

    Then torch's idle intra-op threads spin for a core the workers need, and a worker preempted inside a
    parallel region stalls the others at its barrier: measured on 2 cores, one intra-op thread gave 2x
    (1 worker, JPEG prep) to 4.6x (2 workers, a step of dense layers) with nothing else changed. The
    rate model has no term for that contention (what it costs depends on the scheduler, not on the
    measures), so a tool that sees it tries one thread as a trial and lets the measurement decide."""
    return intra_op_threads > 1 and intra_op_threads + num_workers > cores


def contended(m: EpochMeasure) -> bool:
    """Whether one intra-op thread is worth a trial: the trainer's threads and the workers outnumber the
    cores while the loop waits on the loader or its step computes on this CPU (a step that waits on an
    accelerator, or sleeps, uses almost none: its threads take no core from anyone).

    Not whether the loop waits alone: on the loaded 2-core VM the README job (2 threads, 1 worker) waited
    on its loader 2-13% of the time, its main process on 0.24-0.28 cores, and ran 2.4x faster on one
    thread: the step's threads waited for each other at its parallel regions' barriers.

    Not while the host leaves a quarter of the cores idle (``idle_cores``): then no thread waits for a core.
    On the quiet 2-core VM a job whose workers wait 5 ms per read (2 threads, 2 workers, the loop waiting
    95% of the time) measured the same on one thread, and the trial cost it two epochs before more workers.
    """
    oversub = oversubscribed(m.knobs.intra_op_threads, m.knobs.num_workers, m.cores)
    idle = m.idle_cores is not None and m.idle_cores >= IDLE_CORES_FREE * m.cores
    return oversub and not idle and (data_bound(m) or m.step_cpu_share >= STEP_ON_CPU)


def _main_cores_at(m: EpochMeasure, knobs: Knobs) -> float:
    """The main process's cores at ``knobs``: one intra-op thread uses at most one core."""
    if knobs.intra_op_threads == 1 and m.knobs.intra_op_threads > 1:
        return min(m.main_cores, 1.0)
    return m.main_cores


def prep_rate(m: EpochMeasure, knobs: Knobs) -> float:
    """Items per second the workers prep at ``knobs`` on the cores the main process leaves them."""
    workers = knobs.num_workers
    if workers == 0:  # the main process preps itself, in the loop's own time
        return 1.0 / max(m.worker_cpu_s_per_item, 1e-9)
    cores_free = max(m.cores - _main_cores_at(m, knobs), 0.5)
    if storage_bound(m):  # fetch-bound: the reads in flight, one per worker, set the rate, not cores
        per_core = 1.0 / max(m.worker_cpu_s_per_item, 1e-9)
        return min(m.rate * workers / max(1, m.knobs.num_workers), min(workers, cores_free) * per_core)
    return min(workers, cores_free) / max(m.worker_cpu_s_per_item, 1e-9)


def _model(m: EpochMeasure, knobs: Knobs) -> float:
    compute = m.compute_s_per_item
    trainer = 1.0 / compute if compute > 0 else float("inf")
    return min(trainer, prep_rate(m, knobs))


def predict_rate(m: EpochMeasure, knobs: Knobs) -> float:
    """The loop's items per second at ``knobs``: the model, scaled by what it missed at the measured knobs."""
    if not data_bound(m) and knobs.intra_op_threads >= m.knobs.intra_op_threads:
        return m.rate  # the trainer binds: the loader's knobs cannot move the rate
    at_measured = _model(m, m.knobs)
    scale = m.rate / at_measured if at_measured > 0 and at_measured != float("inf") else 1.0
    if knobs.prefetch_factor > m.knobs.prefetch_factor and scale < 1 - QUEUE_LOSS:
        scale = 1.0  # a deeper queue recovers at most what the pipeline lost to bursts: the model's miss
    return _model(m, knobs) * min(scale, 1.0)


def merged(a: EpochMeasure, b: EpochMeasure) -> EpochMeasure:
    """Two windows at the same knobs as one (a change judged on more batches than one epoch holds)."""
    if a.knobs != b.knobs:
        raise ValueError(f"tune: cannot merge epochs at {a.knobs} and {b.knobs}")
    idle = None
    if a.idle_cores is not None and b.idle_cores is not None:
        idle = (a.idle_cores * a.wall_s + b.idle_cores * b.wall_s) / max(a.wall_s + b.wall_s, 1e-12)
    return EpochMeasure(
        a.items + b.items, a.wall_s + b.wall_s, a.wait_s + b.wait_s, a.main_cpu_s + b.main_cpu_s,
        a.workers_cpu_s + b.workers_cpu_s, a.knobs, min(a.cores, b.cores), a.receive_cpu_s + b.receive_cpu_s, idle,
    )  # fmt: skip


def with_knob(knobs: Knobs, **change: int) -> Knobs:
    return replace(knobs, **change)

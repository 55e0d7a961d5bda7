"""The differential runs' tools that do not depend on the kind of job: timing a loader alone, a replayed
batch, a cold page cache.

DS-Analyzer's method: run the same job several times, each time removing one source of stall, and
read each stall off as the difference between two runs.

``compute``       one real batch, replayed from memory every iteration: only the step is left.
``prep_scaling``  the loader alone (no step), raw items from memory, at k = 1..cores workers:
                  the prep pipeline's capacity and how it scales with cores. Also measures the cold
                  fetch rate and the dataset's size.
``prep``          the full job with raw items from memory: compute + prep stall.
``real``          the full job starting from a cold page cache: compute + prep stall + fetch stall.

What each run changes in a loader depends on the loader's kind and lives with it in
:mod:`dsanalyzer.jobs` (torch's and coordl's DataLoader: :mod:`dsanalyzer.jobs.torch_loader`; a DALI
iterator: :mod:`dsanalyzer.jobs.dali_iter`); they all time with the functions here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from dsanalyzer.measure import fetchrate

__all__ = [
    "ReplayIterator",
    "batch_items",
    "files_bytes",
    "evict_cold",
    "shutdown_iterator",
    "loader_alone_rate",
    "JobCpu",
    "available_cores",
    "measure_prep_scaling",
]


def batch_items(batch: Any, default: int = 1) -> int:
    """Samples in a batch: the leading dimension of its first tensor/array, found recursively."""
    for _ in range(4):
        shape = getattr(batch, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
        if isinstance(batch, dict) and batch:
            batch = next(iter(batch.values()))
        elif isinstance(batch, (list, tuple)) and batch:
            if not hasattr(batch[0], "shape") and not isinstance(batch[0], (list, tuple, dict)):
                return len(batch)
            batch = batch[0]
        else:
            break
    return default


def shutdown_iterator(it: Any) -> None:
    """Stop an iterator's worker processes now rather than at garbage collection."""
    stop = getattr(it, "_shutdown_workers", None)
    if callable(stop):
        stop()


class ReplayIterator:
    """Hands out the same batch forever: the compute run's data path costs nothing."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def __iter__(self) -> ReplayIterator:
        return self

    def __next__(self) -> Any:
        return self.batch


def files_bytes(files: list[str]) -> int:
    """The total size of ``files`` (a file that vanished counts 0)."""
    total = 0
    for path in files:
        try:
            total += os.path.getsize(path)
        except OSError:
            pass
    return total


def evict_cold(files: list[str]) -> dict:
    """Drop ``files`` from the page cache so the real run reads storage; what was evicted, and what stayed."""
    evicted = fetchrate.evict_files(files)
    return {
        "files": len(files),
        "evicted": evicted,
        "resident_fraction_after": fetchrate.resident_fraction(files[:200]) if files else None,
    }


class JobCpu:
    """CPU seconds of this process (every thread) and of its descendants (loader workers), over an interval.

    Workers come and go (torch starts new ones each epoch unless they persist), and a process that has
    exited cannot be asked its CPU time. The kernel adds a reaped child's whole CPU to its parent's
    (``RUSAGE_CHILDREN``, ``os.times()``), so :meth:`total` is this process's CPU, its reaped
    descendants' and the live ones' as read now. An earlier meter kept each worker's last reading, taken
    every 0.1 s, and lost the rest of its life: 0.27 ms of 4.75 per sample on a 2-worker job of 32
    batches an epoch (2-core Intel VM, 2026-11-28).
    """

    def __init__(self) -> None:
        self._live: dict[tuple[int, float], float] = {}  # (pid, create time) -> CPU seconds, as last read
        self.sample()

    def sample(self) -> None:
        import psutil  # lazy: the import hook loads this module into every profiled process

        try:
            children = psutil.Process().children(recursive=True)
        except psutil.Error:
            return
        live: dict[tuple[int, float], float] = {}
        for child in children:
            try:
                with child.oneshot():
                    t, born = child.cpu_times(), child.create_time()
            except psutil.Error:  # a worker that exited between the listing and the read
                continue
            live[(child.pid, born)] = t.user + t.system
        self._live = live

    def total(self) -> float:
        self.sample()
        reaped = os.times()
        return time.process_time() + reaped.children_user + reaped.children_system + sum(self._live.values())


def loader_alone_rate(
    loader: Any,
    open_iter: Callable[[], Iterator],
    iters: int,
    warmup: int,
    tick: Callable[[], None],
    cpu: dict | None = None,
) -> float:
    """Samples/s of pulling batches as fast as possible, after ``warmup`` batches.

    ``cpu``, when given, receives what the timed batches cost in CPU: ``cpu_s_per_sample`` (this
    process and its workers, all together: the data path's CPU work per sample, whichever process
    does it), ``receive_cpu_s_per_batch`` (the main thread's own, inside ``__next__``), and
    ``cpu_share``: that CPU over the wall time times the cores the job may use (below 1 when the
    job's processes waited for a core that other processes held, or when they did not use every core).

    The rate is the steady one: a new epoch's start (new workers, an empty pipeline, until each of the
    ``w`` workers has handed over its first batch) is left out, time, CPU and batches, because the model
    charges the real run's measured epoch start once per epoch on top of it. Counted in, a dataset of a
    few dozen batches an epoch read ~8% slow here and was charged its starts twice; a start still
    filling when the window closed read 5% slow (32 batches an epoch, the 65th batch a refill). The
    ``next()`` that raises StopIteration (torch shuts the old workers down in it: 7.5 ms a 2-worker
    epoch here) stays in, time and CPU: its workers' CPU can only be read once they are reaped, after it.
    """
    it = open_iter()
    samples = batches = 0
    t0 = time.perf_counter()
    cpu0 = thread0 = 0.0
    left_out = [0.0, 0.0, 0.0]  # seconds, CPU seconds and main-thread CPU seconds of epoch starts
    refill, restart = 0, (0.0, 0.0, 0.0)  # a new epoch's batches still filling; (time, CPU, thread CPU) then
    meter = JobCpu() if cpu is not None else None

    def leave_out() -> None:  # the epoch start since ``restart``, the part after warm-up
        left_out[0] += time.perf_counter() - max(restart[0], t0)
        left_out[1] += meter.total() - max(restart[1], cpu0) if meter is not None else 0.0
        left_out[2] += time.thread_time() - max(restart[2], thread0)

    try:
        for i in range(warmup + iters):
            if i == warmup:
                t0 = time.perf_counter()
                samples = batches = 0
                left_out = [0.0, 0.0, 0.0]
                if meter is not None:
                    cpu0, thread0 = meter.total(), time.thread_time()
            try:
                batch = next(it)
            except StopIteration:  # the old workers are reaped: their CPU is all in the meter now
                restart = (
                    time.perf_counter(),
                    meter.total() if meter is not None else 0.0,
                    time.thread_time(),
                )
                shutdown_iterator(it)
                refill = max(1, int(getattr(loader, "num_workers", 0) or 0))
                it = open_iter()
                batch = next(it, None)
                if batch is None:
                    raise RuntimeError(f"the loader ({type(loader).__name__}) yielded no batches") from None
            filling = refill > 0 and i >= warmup
            if refill:
                refill -= 1
                if not refill and i >= warmup:
                    leave_out()
            if not filling:
                samples += batch_items(batch, getattr(loader, "batch_size", None) or 1)
                batches += 1
            tick()
        if refill and iters > 0:  # the window closed during a start: none of it was steady
            leave_out()
        if cpu is not None and meter is not None and samples > 0:  # read before the workers are shut down
            elapsed, used = time.perf_counter() - t0 - left_out[0], meter.total() - cpu0 - left_out[1]
            cpu["cpu_s_per_sample"] = used / samples
            cpu["receive_cpu_s_per_batch"] = (time.thread_time() - thread0 - left_out[2]) / max(1, batches)
            cpu["cpu_share"] = used / (elapsed * available_cores()) if elapsed > 0 else None
    finally:
        shutdown_iterator(it)
    elapsed = time.perf_counter() - t0 - left_out[0]
    return samples / elapsed if elapsed > 0 else float("inf")


def available_cores() -> int:
    """The cores this process may run on (its affinity mask: ``taskset``, a cgroup cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _set_num_workers(loader: Any, workers: int) -> None:
    loader.num_workers = workers


def measure_prep_scaling(
    loader: Any,
    open_iter: Callable[[], Iterator],
    workers_list: list[int],
    iters: int,
    warmup: int,
    progress: Callable[[int], None] | None = None,
    set_workers: Callable[[Any, int], None] | None = None,
) -> dict:
    """Samples/s of the loader alone (no step) at each worker count; epochs restart as needed.

    A worker count the loader cannot run (a loader that sized per-worker state for its own count)
    is left out and noted under ``skipped``; the loader's own count must work. ``set_workers(loader, k)``
    changes the count the job kind's way (default: ``loader.num_workers = k``).
    """
    original = int(getattr(loader, "num_workers", 0) or 0)
    set_workers = set_workers or _set_num_workers
    done = [0]

    def tick() -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0])

    ks, rates, skipped, costs = [], [], {}, []
    try:
        for k in workers_list:
            set_workers(loader, k)
            cost: dict = {}
            try:
                rates.append(loader_alone_rate(loader, open_iter, iters, warmup, tick, cpu=cost))
            except Exception as e:
                if k == original:
                    raise
                skipped[str(k)] = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
                continue
            ks.append(k)
            costs.append(cost)
    finally:
        set_workers(loader, original)
    out: dict = {"workers": ks, "samples_per_s": rates, "cores": available_cores()}
    for key in ("cpu_s_per_sample", "receive_cpu_s_per_batch", "cpu_share"):
        out[key] = [c.get(key) for c in costs]
    if skipped:
        out["skipped"] = skipped
    return out

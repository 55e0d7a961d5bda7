"""Recording one differential run inside the profiled process: each batch's wait, progress, the result file.

:class:`RunRecorder` is the measuring half of the import hook (:mod:`dsanalyzer.intercept` decides
which loader is timed and prepares it; this records it): it times every batch the job pulls on a
:class:`~dsanalyzer.measure.timeline.Timeline`, counts down warm-up + ``iters`` batches (then keeps
going until ``min_seconds`` of measured batches have passed), writes ``progress-<pid>.txt`` for the
CLI's bar at most twice a second, and writes ``result-<pid>.json`` atomically (the CLI may be
polling for it).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from typing import Any

from dsanalyzer.measure import threads
from dsanalyzer.measure.hookconfig import HookConfig
from dsanalyzer.measure.timeline import Timeline

__all__ = ["RunRecorder", "RunComplete", "RESULT_FORMAT"]

RESULT_FORMAT = "dsanalyzer-run/1"
_PROGRESS_EVERY_S = 0.5


class RunComplete(Exception):
    """The run has recorded what it was asked for: the hook writes the result and stops the script."""


# RunRecorder._cpu_from, read at the first measured batch: (wall, main CPU, workers' CPU, the main thread's
# involuntary context switches, the seconds the cores were idle)


class RunRecorder:
    """The batches of one run in one process: their waits, how many are left, progress and the result."""

    def __init__(self, cfg: HookConfig) -> None:
        self.cfg = cfg
        self.pid = os.getpid()
        self.timeline = Timeline()
        self.remaining = cfg.warmup + cfg.iters
        self.measure_from: float | None = None  # when the first measured (post-warm-up) batch was asked for
        self._last_progress = 0.0
        self._cpu_from: tuple[float, float, float, int | None, float | None] | None = None  # (see above)
        # the loader's own counters, read when the measured batches start and at the result (the
        # intercept sets it for a loader that keeps some: coordl's remote_items, the remote side's share)
        self.counters: Callable[[], dict[str, float]] | None = None
        self._counters_from: dict[str, float] | None = None

    def next_batch(self, pull: Callable[[], Any], items_of: Callable[[Any], int]) -> Any:
        """One batch from ``pull``, its wait recorded; :class:`RunComplete` once the run has enough."""
        self.timeline.next_started()
        if self.measure_from is None and self.remaining <= self.cfg.iters:
            self.measure_from = time.monotonic()
            self._cpu_from = (time.perf_counter(), *_job_cpu(), _main_preempts(), _idle_s())
            self._counters_from = self._read_counters()
        started = self.measure_from  # set once remaining <= cfg.iters
        if self.remaining <= 0 and started is not None and time.monotonic() - started >= self.cfg.min_seconds:
            raise RunComplete
        try:
            batch = pull()
        except StopIteration:
            self.timeline.abandon_pending()
            raise
        self.timeline.next_ended(items_of(batch))
        self.remaining -= 1
        if time.monotonic() - self._last_progress >= _PROGRESS_EVERY_S:
            self.progress(*self.progress_counts())
        return batch

    @property
    def batches(self) -> int:
        """Batches recorded so far (the index of the step that follows the last one, plus one)."""
        return len(self.timeline.wait_s)

    def progress(self, done: int, total: int, force: bool = False) -> None:
        """Write ``progress-<pid>.txt`` (done, total) for the CLI's bar; at most every half second."""
        now = time.monotonic()
        if not force and now - self._last_progress < _PROGRESS_EVERY_S:
            return
        self._last_progress = now
        path = os.path.join(self.cfg.result_dir, f"progress-{self.pid}.txt")
        try:
            with open(path, "w") as f:
                f.write(f"{done} {total}\n")
        except OSError:
            pass

    def progress_counts(self) -> tuple[int, int]:
        """(progress, total) with a fixed total, warm-up + ``iters`` (a total that moved looked like a run that
        grew). Past warm-up, the measured part's share done, the lesser of iterations over ``iters`` and seconds
        over ``min_seconds`` (the run stops when both are reached). ``fix --online``: epochs begun, of the most."""
        if self.cfg.tune_epochs:
            return min(len(self.timeline.epoch_starts), self.cfg.tune_epochs), self.cfg.tune_epochs
        total = self.cfg.warmup + self.cfg.iters
        done = total - self.remaining  # past total when min_seconds keeps the run going
        if self.cfg.min_seconds > 0 and self.measure_from is not None:
            measured = max(0, done - self.cfg.warmup)
            elapsed = time.monotonic() - self.measure_from
            share = min(1.0, measured / max(1, self.cfg.iters), elapsed / self.cfg.min_seconds)
            done = self.cfg.warmup + math.floor(self.cfg.iters * share)
        return min(done, total), total

    def _job_cpu_section(self) -> dict | None:
        """What the measured batches cost the job in CPU: the main process (all its threads) per batch,
        the main process and its workers together per sample, and that CPU over wall time x cores."""
        if self._cpu_from is None:
            return None
        wall = time.perf_counter() - self._cpu_from[0]
        main, workers = _job_cpu()
        main, workers = main - self._cpu_from[1], workers - self._cpu_from[2]
        measured = self.timeline.batch_items[self.cfg.warmup :]
        samples, batches = sum(measured), len(measured)
        if samples <= 0 or wall <= 0:
            return None
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:
            cores = os.cpu_count() or 1
        preempts, preempts_from = _main_preempts(), self._cpu_from[3]
        return {
            "main_cpu_s_per_batch": main / batches,
            # how often the main thread lost its core mid-work: each time, torch's other intra-op threads
            # wait at the region's barrier, spinning (dsanalyzer.model.cores)
            "main_preempts_per_batch": None
            if preempts is None or preempts_from is None
            else (preempts - preempts_from) / batches,
            "cpu_s_per_sample": (main + workers) / samples,
            "cpu_share": (main + workers) / (wall * cores),
            "idle_cores": _idle_cores_since(self._cpu_from[4], wall),
            "cores": cores,
            "batches": batches,
        }

    def _read_counters(self) -> dict[str, float] | None:
        if self.counters is None:
            return None
        try:
            return {k: float(v) for k, v in self.counters().items()}
        except Exception:  # noqa: BLE001 - a loader closed by the script: the counters are then unknown
            return None

    def _counters_section(self) -> dict[str, float] | None:
        """Each loader counter's growth over the measured batches (None: none kept, or not readable)."""
        now, then = self._read_counters(), self._counters_from
        if now is None or then is None:
            return None
        grown = {k: now[k] - then[k] for k in now if k in then}
        return None if any(v < 0 for v in grown.values()) else grown  # reset by the script: unknown

    def write_result(self, status: str, info: dict) -> None:
        """Write ``result-<pid>.json``: the recorded run, ``info`` (what preparing the run found) after it."""
        if self.cfg.mode != "prep_scaling":  # its progress counts the scaling iterations, already final
            done, total = self.progress_counts()  # a run that reached its target ends full
            self.progress(total if self.remaining <= 0 else done, total, force=True)
        tl = self.timeline
        result = {
            "format": RESULT_FORMAT,
            "pid": self.pid,
            "mode": self.cfg.mode,
            "status": status,
            "iters_target": self.cfg.iters,
            "warmup": self.cfg.warmup,
            "wait_s": tl.wait_s,
            "step_s": tl.step_s,
            "batch_items": tl.batch_items,
            "wait_cpu_s": tl.wait_cpu_s,
            "step_cpu_s": tl.step_cpu_s,
            "starts_s": tl.starts,
            "epoch_starts": tl.epoch_starts,
            "t0_unix_s": None if tl.t0 is None else time.time() - (time.perf_counter() - tl.t0),
            "job_cpu": self._job_cpu_section(),
            "loader_counters": self._counters_section(),
            **threads.facts(),
            "rank": int(os.environ.get("RANK", "0") or 0),
            "world_size": int(os.environ.get("WORLD_SIZE", "1") or 1),
            **info,
        }
        path = os.path.join(self.cfg.result_dir, f"result-{self.pid}.json")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f)
        os.replace(tmp, path)


def _main_preempts() -> int | None:
    """The main thread's involuntary context switches so far (None: no /proc)."""
    try:
        with open(f"/proc/{os.getpid()}/task/{os.getpid()}/status") as f:
            for line in f:
                if line.startswith("nonvoluntary_ctxt_switches:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _idle_cores_since(idle_from: float | None, wall: float) -> float | None:
    """The cores the host left idle since ``idle_from`` (:func:`_idle_s`), ``wall`` seconds ago, whoever used
    the rest: none idle is where the trainer's threads and the workers may contend (dsanalyzer.judge.fixplan)."""
    idle = _idle_s()
    return None if idle is None or idle_from is None else max(idle - idle_from, 0.0) / wall


def _idle_s() -> float | None:
    """Seconds the CPUs this process may run on have been idle, as ``tune=True`` reads them (None: unknown)."""
    import psutil  # lazy, as in _job_cpu

    from coordl.tune.tuner import idle_cpu_s

    try:
        return idle_cpu_s()
    except (psutil.Error, OSError):
        return None


def _job_cpu() -> tuple[float, float]:
    """(this process's CPU on every thread, its children's): reaped children through ``RUSAGE_CHILDREN``
    (torch joins an epoch's workers), live ones read now; nothing is read per batch."""
    import resource

    import psutil  # lazy: the import hook loads this module into every profiled process

    live = 0.0
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        children = []
    for child in children:
        try:
            t = child.cpu_times()
        except (
            psutil.Error
        ):  # exited between the listing and the read: its CPU is in RUSAGE_CHILDREN once reaped
            continue
        live += t.user + t.system
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time(), live + reaped.ru_utime + reaped.ru_stime

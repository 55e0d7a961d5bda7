"""The interface through which a trainer reports its communication timings to dsanalyzer.

dsanalyzer sits below gradcomp in the dependency order, so it defines the interface and gradcomp
(or any trainer) implements it; dsanalyzer never imports gradcomp. Two ways in:

* **Any collective**: call :func:`record_collective` with the collective's name, its payload bytes,
  the seconds it took, and when the step was waiting on it (``exposed_s``: the part of it not hidden
  behind computation). A process that is not being profiled pays one attribute lookup and a ``None``
  check.
* **DDP's default all-reduce**: ``ddp_model.register_comm_hook(None, dsanalyzer.jobs.comm.timed_allreduce)``
  (or :func:`wrap_hook` around another hook) times each bucket's all-reduce from the hook call to the
  future's completion. The exposed part of a step is the time from its last bucket's hook call (the
  backward pass is then done) until every reduction in flight has completed. Under ``dsanalyzer
  profile`` a DDP model with no comm hook of its own gets ``timed_allreduce`` at its first forward.

Under ``dsanalyzer profile`` the import hook makes a :class:`CommLog` the process's recorder; the
profiler files each record under the iteration it happened in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["CommRecorder", "CommLog", "record_collective", "set_recorder", "timed_allreduce", "wrap_hook"]


class CommRecorder(Protocol):
    """What receives the timings (dsanalyzer's :class:`CommLog` while a job is profiled)."""

    def record(self, name: str, nbytes: int, seconds: float, exposed_s: float | None = None) -> None: ...


_recorder: CommRecorder | None = None


def set_recorder(recorder: CommRecorder | None) -> None:
    """Make ``recorder`` receive this process's timings (None: stop recording)."""
    global _recorder
    _recorder = recorder


def record_collective(name: str, nbytes: int, seconds: float, exposed_s: float | None = None) -> None:
    """Report one collective: ``nbytes`` of payload per rank, ``seconds`` from launch to completion,
    ``exposed_s`` of them the step waited for (None: unknown, counted as wholly exposed)."""
    recorder = _recorder
    if recorder is not None:
        recorder.record(name, int(nbytes), float(seconds), None if exposed_s is None else float(exposed_s))


class CommLog:
    """Per-iteration totals of the collectives recorded (thread-safe: DDP completes futures in a thread).

    ``iteration`` is advanced by the profiler at each batch boundary; records land in that iteration.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.iteration = 0
        self.per_iter: dict[int, dict[str, float]] = {}
        self.collectives: list[tuple[int, float]] = []  # (bytes, seconds) of each, for the cost model

    def record(self, name: str, nbytes: int, seconds: float, exposed_s: float | None = None) -> None:
        with self._lock:
            row = self.per_iter.setdefault(
                self.iteration, {"bytes": 0.0, "comm_s": 0.0, "exposed_s": 0.0, "n": 0.0}
            )
            row["bytes"] += nbytes
            row["comm_s"] += seconds
            row["exposed_s"] += seconds if exposed_s is None else exposed_s
            row["n"] += 1
            if len(self.collectives) < 4096:
                self.collectives.append((nbytes, seconds))

    def series(self, iterations: int) -> dict[str, list]:
        """Per-iteration lists (zeros where nothing was recorded), JSON-ready."""
        with self._lock:
            rows = [self.per_iter.get(i, {}) for i in range(iterations)]
            return {
                "bytes": [float(r.get("bytes", 0.0)) for r in rows],
                "comm_s": [float(r.get("comm_s", 0.0)) for r in rows],
                "exposed_s": [float(r.get("exposed_s", 0.0)) for r in rows],
                "collectives": [list(c) for c in self.collectives],
            }


class _StepWatch:
    """Tracks the collectives in flight and the launch of each step's last bucket."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last_bucket_at: float | None = None
        self.pending = 0


def wrap_hook(hook: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """A DDP comm hook that runs ``hook`` and reports each bucket's time through :func:`record_collective`.

    Exposed time: DDP calls the hook of the step's last bucket (``bucket.is_last()``) when the backward
    pass has produced every gradient; from then until every reduction in flight has completed, the
    step waits. That wait is attributed to the collective that completes last; the others are hidden.
    """
    watch = _StepWatch()

    # No annotations: DDP's register_comm_hook rejects a bucket annotated other than dist.GradBucket
    # (and this module must not import torch.distributed to name it).
    def timed(state, bucket):  # noqa: ANN001, ANN202
        t0 = time.perf_counter()
        buffer = bucket.buffer()
        nbytes = buffer.numel() * buffer.element_size()
        with watch.lock:
            watch.pending += 1
            if bucket.is_last():
                watch.last_bucket_at = t0
        fut = hook(state, bucket)

        def done(f: Any) -> Any:
            t1 = time.perf_counter()
            exposed = 0.0
            with watch.lock:
                watch.pending -= 1
                if watch.pending == 0 and watch.last_bucket_at is not None:
                    exposed = max(0.0, t1 - watch.last_bucket_at)
                    watch.last_bucket_at = None
            record_collective("allreduce", nbytes, t1 - t0, exposed)
            return f.value()

        return fut.then(done)

    return timed


def _default_allreduce(state, bucket):  # noqa: ANN001, ANN202 (see wrap_hook)
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    return allreduce_hook(state, bucket)


timed_allreduce = wrap_hook(_default_allreduce)

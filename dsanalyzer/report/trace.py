"""The real run's per-iteration timeline as a Chrome / Perfetto trace (``dsanalyzer profile --trace``).

Open ``trace.json`` in https://ui.perfetto.dev or ``chrome://tracing``. Trace-event format (JSON
object form): one process per rank, named ``rank R``; in it one track for the training loop (``wait
for data``, then ``step``, per iteration, as the iterator boundary measured them) and one track per
loader worker. Times are microseconds from the earliest rank's first batch request; ranks are aligned
by their wall clocks (``t0_unix_s`` in each rank's result).

What each track shows, and where it comes from:

* ``wait for data`` / ``step``: measured (``wait_s``, ``step_s``, ``starts_s`` of the real run).
* ``communication``: a DDP job's collectives per iteration (``comm.comm_s``), and the part the step
  waited for (``comm.exposed_s``); the hook measures their durations, not their start, so they are
  drawn ending where the step ends (the last bucket's reduction is what a step waits for).
* loader worker ``k``: torch hands batch ``i`` out of worker ``i % num_workers`` (its in-order
  round robin), so each batch's arrival is an instant event on that worker's track, with the time
  the loop waited for it. A worker's own busy time is not traced (it runs in another process).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dsanalyzer.report.files import atomic_write_text

__all__ = ["trace_events", "write_trace", "PHASES"]

PHASES = ("X", "i", "M")  # complete events, instant events, metadata: all this writer emits
_US = 1e6


def _meta(pid: int, tid: int | None, kind: str, name: str) -> dict:
    event = {"name": kind, "ph": "M", "pid": pid, "args": {"name": name}}
    if tid is not None:
        event["tid"] = tid
    return event


def _rank_events(run: dict, pid: int, origin_s: float, workers: int) -> list[dict]:
    """One rank's loop, communication and worker tracks."""
    offset = float(run.get("t0_unix_s") or origin_s) - origin_s
    starts, waits, steps = run.get("starts_s") or [], run.get("wait_s") or [], run.get("step_s") or []
    comm = run.get("comm") or {}
    total, exposed = comm.get("comm_s") or [], comm.get("exposed_s") or []
    events = [_meta(pid, None, "process_name", f"rank {run.get('rank', pid)}"),
              _meta(pid, 0, "thread_name", "training loop (main process)")]  # fmt: skip
    if total:
        events.append(_meta(pid, 1, "thread_name", "communication"))
    for k in range(workers):
        events.append(_meta(pid, 10 + k, "thread_name", f"loader worker {k}"))
    for i, (start, wait) in enumerate(zip(starts, waits, strict=False)):
        t = (offset + start) * _US
        events.append({"name": "wait for data", "cat": "data", "ph": "X", "pid": pid, "tid": 0,
                       "ts": t, "dur": wait * _US, "args": {"iteration": i}})  # fmt: skip
        if workers:
            events.append({"name": f"batch {i} ready", "cat": "data", "ph": "i", "s": "t", "pid": pid,
                           "tid": 10 + i % workers, "ts": t + wait * _US,
                           "args": {"iteration": i, "loop_waited_ms": wait * 1e3}})  # fmt: skip
        if i >= len(steps):
            continue
        step_start, step = t + wait * _US, steps[i] * _US
        events.append({"name": "step", "cat": "compute", "ph": "X", "pid": pid, "tid": 0,
                       "ts": step_start, "dur": step, "args": {"iteration": i}})  # fmt: skip
        for name, series in (("collectives", total), ("exposed communication", exposed)):
            if i < len(series) and series[i] > 0:
                dur = min(series[i] * _US, step)
                events.append({"name": name, "cat": "comm", "ph": "X", "pid": pid, "tid": 1,
                               "ts": step_start + step - dur, "dur": dur, "args": {"iteration": i}})  # fmt: skip
    return events


def trace_events(real: dict, workers: int) -> dict:
    """The trace (JSON object form) of the real run's result: ``real["ranks"]`` for a distributed job."""
    ranks = real.get("ranks") or [real]
    origins = [float(r["t0_unix_s"]) for r in ranks if r.get("t0_unix_s")]
    origin = min(origins) if origins else 0.0
    events: list[dict] = []
    for n, run in enumerate(ranks):
        events += _rank_events(run, int(run.get("rank", n)), origin, workers)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"source": "dsanalyzer profile --trace: the real run", "origin_unix_s": origin},
    }


def write_trace(results: dict, report: dict, out_dir: str | os.PathLike) -> Path:
    """Write ``trace.json`` beside report.json from the real run's raw result."""
    path = Path(out_dir) / "trace.json"
    trace = trace_events(results.get("real") or {}, int(report.get("workers") or 0))
    atomic_write_text(path, json.dumps(trace) + "\n")
    return path

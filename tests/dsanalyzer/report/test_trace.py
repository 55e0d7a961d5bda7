"""``dsanalyzer profile --trace``: the real run's timeline in the Chrome / Perfetto trace-event format."""

from __future__ import annotations

import json
import numbers

import pytest

from dsanalyzer.report.trace import trace_events, write_trace

# The trace-event format (Google's "Trace Event Format" document): the JSON object form, with
# complete events (X: ts + dur), instant events (i: scope s in g/p/t) and metadata (M: process_name,
# thread_name with args.name). Timestamps in microseconds.
_METADATA = {"process_name", "thread_name", "process_sort_index", "thread_sort_index"}


def check_trace_format(trace: dict) -> None:
    """Raise AssertionError where ``trace`` is not valid trace-event JSON (object form)."""
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list)
    assert trace.get("displayTimeUnit", "ms") in ("ms", "ns")
    json.loads(json.dumps(trace, allow_nan=False))  # strict JSON: no NaN or Infinity
    for e in trace["traceEvents"]:
        assert isinstance(e["name"], str) and isinstance(e["pid"], int), e
        ph = e["ph"]
        if ph == "M":
            assert e["name"] in _METADATA and isinstance(e["args"]["name"], str), e
            if e["name"].startswith("thread"):
                assert isinstance(e["tid"], int), e
            continue
        assert isinstance(e["tid"], int) and isinstance(e["ts"], numbers.Real) and e["ts"] >= 0, e
        if ph == "X":
            assert isinstance(e["dur"], numbers.Real) and e["dur"] >= 0, e
        elif ph == "i":
            assert e.get("s", "t") in ("g", "p", "t"), e
        else:
            raise AssertionError(f"phase {ph!r} is not one dsanalyzer writes: {e}")


def rank(r: int, t0: float, comm: bool = False) -> dict:
    n = 6
    run = {
        "rank": r,
        "t0_unix_s": t0,
        "starts_s": [0.05 * i for i in range(n)],
        "wait_s": [0.01] * n,
        "step_s": [0.03] * (n - 1),  # the last iteration's step was cut by the end of the run
    }
    if comm:
        run["comm"] = {"comm_s": [0.012] * n, "exposed_s": [0.004] * n}
    return run


def test_single_process_trace_has_a_loop_track_and_one_track_per_worker(tmp_path):
    real = rank(0, 1000.0)
    path = write_trace({"real": real}, {"workers": 2}, tmp_path)
    trace = json.loads(path.read_text())
    check_trace_format(trace)
    events = trace["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert names == {"rank 0", "training loop (main process)", "loader worker 0", "loader worker 1"}
    loop = sorted((e for e in events if e["ph"] == "X" and e["tid"] == 0), key=lambda e: e["ts"])
    assert [e["name"] for e in loop[:4]] == ["wait for data", "step", "wait for data", "step"]
    assert len(loop) == 6 + 5
    for a, b in zip(loop, loop[1:], strict=False):  # one track, never overlapping
        assert a["ts"] + a["dur"] <= b["ts"] + 1e-6
    assert loop[1]["ts"] == pytest.approx(10_000) and loop[1]["dur"] == pytest.approx(30_000)
    ready = [e for e in events if e["ph"] == "i"]
    assert [e["tid"] for e in ready] == [10, 11, 10, 11, 10, 11]  # torch's round robin over 2 workers


def test_ranks_are_processes_aligned_by_wall_clock_with_their_communication():
    trace = trace_events({"ranks": [rank(0, 1000.0, comm=True), rank(1, 1000.5, comm=True)]}, workers=0)
    check_trace_format(trace)
    events = trace["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1}
    first = {p: min(e["ts"] for e in events if e["ph"] == "X" and e["pid"] == p) for p in (0, 1)}
    assert first[1] - first[0] == pytest.approx(0.5e6)
    comm = [e for e in events if e["pid"] == 0 and e.get("cat") == "comm"]
    steps = {e["args"]["iteration"]: e for e in events if e["pid"] == 0 and e["name"] == "step"}
    for e in comm:  # drawn ending where the step ends
        s = steps[e["args"]["iteration"]]
        assert e["ts"] + e["dur"] == pytest.approx(s["ts"] + s["dur"])
    assert {e["name"] for e in comm} == {"collectives", "exposed communication"}

"""Accuracy against a workload with known truth: compute, prep stall and fetch stall within 5%.

One loader worker (prefetch 2) keeps a single producer busy, so the truth is closed-form: a batch
costs the worker ``B * (fetch + prep)`` (``B * prep`` with raw data in memory) and the loop takes
``max(step, producer)`` per iteration. Fetch and step sleep; prep sleeps or spins (CPU): set to 20,
25 and 50 ms. The producer's time per batch is taken from the worker's own item-to-item cycle, which
also holds its per-batch collate and send (1-3 ms; leaving it out failed the 5% check in CI once:
measured prep stall 53.0 ms against a truth of 50.0). The truth uses the durations the workload really spent, which it records itself:
set + the scheduling delay of a loaded machine (about 1 ms per sleep; a spin can be 5 ms late when
a 2-core machine runs 9 busy processes, which is why the CPU-burning variant needs a quiet machine).
"""

from __future__ import annotations

import os
import statistics

import pytest
from torch.utils.data import DataLoader

import dsanalyzer
from tests.dsanalyzer.workloads import TimedSource, sleep_step

B, FETCH_S, PREP_S, STEP_S = 4, 0.020, 0.025, 0.050
ITERS = 28  # per run; the medians held at 40 too (CI's serial phase: 28 saves ~10 s a test)


def _producer_s(run: dict, with_fetch: bool) -> float:
    """A batch's time in the one worker: its items' cycles, start to start (fetch, prep, and the
    worker's own per-batch work, 1-3 ms of collate and send that fetch + prep alone leave out)."""
    if run.get("cycle"):
        return B * run["cycle"]
    return B * ((run["fetch"] if with_fetch else 0.0) + run["prep"])


def truth(step_s: float, prep_run: dict, real_run: dict) -> dict:
    producer_mem = _producer_s(prep_run, with_fetch=False)
    producer = _producer_s(real_run, with_fetch=True)
    return {
        "compute": step_s,
        "prep_stall": max(0.0, producer_mem - step_s),
        "fetch_stall": max(step_s, producer) - max(step_s, producer_mem),
    }


def _loaded() -> bool:
    return os.getloadavg()[0] > (os.cpu_count() or 1)


def _on_a_shared_machine(check, tmp_path) -> None:
    """``check(dir)``, retried once; skipped if both attempts failed on an overloaded machine.

    The truth is timed on the machine: a CI box running other jobs at once delays the loader's worker and the
    main loop by amounts the workload cannot record. Two failures on a machine not overloaded are real.
    """
    for attempt in range(2):
        try:
            d = tmp_path / f"attempt{attempt}"
            d.mkdir()
            check(d)
            return
        except AssertionError:
            # One more attempt whatever the load: a CPU-timed truth on a 2-core box can miss 5% by a hair
            # when the test runner itself takes a core for a moment. Twice on a machine not overloaded fails.
            if attempt == 1 and not _loaded():
                raise
    pytest.skip(f"machine too loaded for a timed truth (load {os.getloadavg()[0]:.1f}), twice")


def _check(tmp_path, prep_spins: bool) -> None:
    sources: list[TimedSource] = []
    steps: list[float] = []

    def make_loader():
        sources.append(TimedSource(400, 10_000, FETCH_S, PREP_S, prep_spins=prep_spins))
        return DataLoader(sources[-1], batch_size=B, shuffle=True, num_workers=1)

    report = dsanalyzer.profile(make_loader, sleep_step(STEP_S, steps), iters=ITERS, warmup=3, out=tmp_path)
    # make_loader is called once per run, in the order of dsanalyzer.measure.plan.MODES
    scaling, _compute, prep_run, real_run = (s.realized_s() for s in sources)
    expected = truth(statistics.median(steps), prep_run, real_run)
    measured = report["per_iter_s"]
    for key, want in expected.items():
        assert measured[key] == pytest.approx(want, rel=0.05), (key, measured, expected)
    # and against the set values, with room for the scheduling delay
    assert measured["prep_stall"] == pytest.approx(B * PREP_S - STEP_S, rel=0.3)
    assert measured["fetch_stall"] == pytest.approx(B * FETCH_S, rel=0.3)
    assert report["bound"] == "fetch"
    assert report["fetch"]["items_per_s"] == pytest.approx(1 / scaling["fetch"], rel=0.05)
    assert report["dataset"]["avg_item_bytes"] == 10_000
    assert (tmp_path / "report.json").is_file() and (tmp_path / "report.html").is_file()


@pytest.mark.slow
@pytest.mark.exclusive  # measures against a target: runs alone (scripts/test.sh)
def test_stalls_match_the_truth_within_5_percent(tmp_path):
    _on_a_shared_machine(lambda d: _check(d, prep_spins=False), tmp_path)


@pytest.mark.slow
@pytest.mark.exclusive  # measures against a target: runs alone (scripts/test.sh)
def test_stalls_match_the_truth_with_cpu_burning_prep(tmp_path):
    if _loaded():
        pytest.skip(f"machine too loaded for a CPU-timed truth (load {os.getloadavg()[0]:.1f})")
    _on_a_shared_machine(lambda d: _check(d, prep_spins=True), tmp_path)


SCRIPT = """
import atexit, json, os, sys, time
from torch.utils.data import DataLoader
from tests.dsanalyzer.workloads import TimedSource

B, FETCH_S, PREP_S, STEP_S = {B}, {FETCH_S}, {PREP_S}, {STEP_S}
source = TimedSource(400, 10_000, FETCH_S, PREP_S, prep_spins=False)
steps = []

def record_truth():  # what this workload really spent, for the test (not part of profiling)
    out = {{**source.realized_s(), "step": sorted(steps)[len(steps) // 2] if steps else None}}
    with open(os.path.join(sys.argv[1], "truth-" + os.environ["DSANALYZER_MODE"] + ".json"), "w") as f:
        json.dump(out, f)

atexit.register(record_truth)
loader = DataLoader(source, batch_size=B, shuffle=True, num_workers=1)
for epoch in range(100):
    for batch in loader:
        t0 = time.perf_counter()
        time.sleep(STEP_S)
        steps.append(time.perf_counter() - t0)
"""


@pytest.mark.slow
@pytest.mark.exclusive  # measures against a target: runs alone (scripts/test.sh)
def test_cli_profile_of_an_unmodified_script_matches_the_truth(tmp_path):
    _on_a_shared_machine(_check_cli, tmp_path)


def _check_cli(tmp_path) -> None:
    import json
    import sys

    from dsanalyzer.profiler import profile_command

    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(B=B, FETCH_S=FETCH_S, PREP_S=PREP_S, STEP_S=STEP_S))
    report = profile_command(
        [sys.executable, str(script), str(tmp_path)],
        out_dir=tmp_path / "run",
        iters=ITERS,
        warmup=3,
        show_progress=False,
    )
    realized = {
        m: json.loads((tmp_path / f"truth-{m}.json").read_text()) for m in ("compute", "prep", "real")
    }
    expected = truth(realized["compute"]["step"], realized["prep"], realized["real"])
    measured = report["per_iter_s"]
    for key, want in expected.items():
        assert measured[key] == pytest.approx(want, rel=0.05), (key, measured, expected)
    assert report["bound"] == "fetch"

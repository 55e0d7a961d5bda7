"""The GPU axis of the what-if model against jobs measured on a GPU (an NVIDIA H200).

``gpu_whatif_h200.json`` holds three dsanalyzer profiles of ``scripts/gpu/train_job.py`` from one
``scripts/gpu_check.py --only whatif`` run: the same data and loader (4 workers on 4 cores) behind a
CNN of width 512 (72.6 ms a step), 256 (25.8 ms) and 96 (9.6 ms). The heavy job's profile with
``gpu_speedup = S`` (its step time over the lighter job's) stands for the lighter jobs.

What ``S`` changes is the step, and with it the main process's CPU in the step (CUDA's wait spins).
The loader's rates are the same job's in all three, but measured at different times on a shared
machine they differ (prep at 4 workers: 3,191, 2,730 and 2,331 samples/s), so the tests compare what
``S`` moves, and leave the loader's measured rates as they are.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsanalyzer.model.whatif import Model

REPORTS = json.loads((Path(__file__).parent / "gpu_whatif_h200.json").read_text())["reports"]


def _heavy_and(width: str) -> tuple[Model, Model, float]:
    heavy, light = Model.from_report(REPORTS["512"]), Model.from_report(REPORTS[width])
    return heavy, light, light.compute_per_s / heavy.compute_per_s


def _predict(m: Model, s: float = 1.0):
    return m.predict(m.cache_bytes, 4, m.storage_bytes_per_s, gpu_speedup=s, policy=m.cache_policy)


def test_a_gpu_step_costs_the_main_process_cpu_for_as_long_as_it_lasts():
    for width in REPORTS:
        m = Model.from_report(REPORTS[width])
        assert not m.step_on_cpu
        assert m.step_cpu_s == pytest.approx(m.batch_size / m.compute_per_s, rel=0.1)


@pytest.mark.parametrize("width", ["256", "96"])
def test_a_faster_gpu_leaves_the_step_cpu_the_lighter_jobs_measured(width):
    heavy, light, s = _heavy_and(width)
    assert s > 2.5
    saved = (heavy.cpu_per_sample(1.0) - heavy.cpu_per_sample(s)) * heavy.batch_size
    assert heavy.step_cpu_s - saved == pytest.approx(
        light.step_cpu_s, rel=0.05
    )  # 25.5 vs 25.6, 9.6 vs 9.5 ms
    assert heavy.cpu_per_sample(0.5) > heavy.cpu_per_sample(1.0)  # a slower GPU spins longer


def test_the_heavy_profile_at_s_agrees_with_the_lighter_jobs_own_model_where_the_loader_does_not_bind():
    heavy, medium, s = _heavy_and("256")
    at_s, own = _predict(heavy, s), _predict(medium)
    assert at_s.bound == own.bound == "compute"
    assert at_s.samples_per_s == pytest.approx(own.samples_per_s, rel=0.05)  # 2,221 vs 2,184/s


def test_a_faster_gpu_is_no_longer_capped_at_the_heavy_steps_spin():
    # Before, the 73.5 ms of spinning was charged at every S: S = 2.88 and 7.63 both gave 1,586/s.
    heavy, _, s = _heavy_and("96")
    fast = _predict(heavy, s)
    assert fast.bound == "prep"
    assert fast.samples_per_s == pytest.approx(heavy.prep.rate(4), rel=0.02)
    assert fast.samples_per_s > 1.2 * _predict(heavy, 2.88).samples_per_s

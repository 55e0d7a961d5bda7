"""The GPU axis of the what-if model against jobs measured on a GPU (an NVIDIA H200).

``gpu_whatif_h200.json`` holds three dsanalyzer profiles of ``scripts/gpu/train_job.py`` from one
``scripts/gpu_check.py --only whatif`` run: the same data and loader (4 workers on 4 cores) behind a
CNN of width 512 (72.6 ms a step), 256 (25.8 ms) and 96 (9.6 ms). The heavy job's profile with
``gpu_speedup = S`` (its step time over the lighter job's) must predict what the lighter jobs did.
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


def test_a_gpu_step_costs_the_main_process_cpu_for_as_long_as_it_lasts():
    # CUDA's wait for the kernels spins: the main process's CPU in a step is about the step's time.
    for width in REPORTS:
        m = Model.from_report(REPORTS[width])
        assert not m.step_on_cpu
        assert m.step_cpu_s == pytest.approx(m.batch_size / m.compute_per_s, rel=0.1)


@pytest.mark.parametrize("width", ["256", "96"])
def test_a_faster_gpu_shrinks_the_steps_cpu_as_the_lighter_jobs_measured(width):
    heavy, light, s = _heavy_and(width)
    assert s > 2.5
    # The lighter job's own real run: what the heavy job's CPU per sample becomes at S.
    assert heavy.cpu_per_sample(s) == pytest.approx(light.job_cpu_s, rel=0.05)
    # Before: the heavy step's 73.5 ms of spinning was charged at every S (2.09-2.70 ms a sample).
    assert heavy.cpu_per_sample(s) < heavy.cpu_per_sample(1.0) - 0.6 * heavy.step_cpu_s / heavy.batch_size
    # A slower GPU spins longer.
    assert heavy.cpu_per_sample(0.5) > heavy.cpu_per_sample(1.0)


def test_the_cores_no_longer_cap_a_faster_gpu_at_the_heavy_steps_spin():
    heavy, _, s = _heavy_and("256")
    measured = REPORTS["256"]["rates_per_s"]["observed"]
    predict = heavy.predict(
        heavy.cache_bytes, 4, heavy.storage_bytes_per_s, gpu_speedup=s, policy=heavy.cache_policy
    )
    assert predict.samples_per_s == pytest.approx(measured, rel=0.10)  # 1,702 vs 1,735/s (was 1,586)
    # The bound follows S: two speed-ups past the CPU's cap no longer give one and the same rate.
    fast = heavy.predict(
        heavy.cache_bytes, 4, heavy.storage_bytes_per_s, gpu_speedup=7.6, policy=heavy.cache_policy
    )
    assert fast.samples_per_s > predict.samples_per_s * 1.1

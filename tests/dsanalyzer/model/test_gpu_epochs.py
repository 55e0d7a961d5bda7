"""Epoch starts in the prediction, against three GPU jobs whose epochs are short (an NVIDIA H200).

``gpu_epochs_h200.json`` holds the three profiles of ``scripts/gpu/train_job.py`` from the whole
``scripts/gpu_check.py`` run of 2026-11-26 17:36 UTC (widths 512, 256 and 96; 18 batches an epoch; a
coordl.DataLoader with 4 non-persistent workers), with the real runs' per-batch waits. Each epoch's first
batch waited 77-112 ms against a few ms for the others: 13-18% of the light jobs' time, which the
steady stage rates do not see. The own-profile predictions were +27.6% and +26.9% above the measured
rates for the two lighter jobs; with the epoch start they are within 10% (the heavy job's -2.9%).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from dsanalyzer.measure.stalls import epoch_start
from dsanalyzer.model import search
from dsanalyzer.model.whatif import Model

REPORTS = json.loads((Path(__file__).parent / "gpu_epochs_h200.json").read_text())["reports"]


@pytest.mark.parametrize("width", ["512", "256", "96"])
def test_the_stored_epoch_start_is_what_the_real_runs_waits_give(width):
    r = REPORTS[width]
    real = r["runs"]["real"]
    got = epoch_start(real["wait_s"], real["epoch_starts"], r["warmup_iters"])
    for key in ("s_per_epoch", "epochs", "first_wait_s", "typical_wait_s"):
        assert got[key] == pytest.approx(r["epoch_start"][key], rel=1e-4)  # the waits are stored to 1 us
    assert 0.07 < got["s_per_epoch"] < 0.1  # 82-92 ms: new workers and an empty pipeline, every epoch


@pytest.mark.parametrize("width", ["512", "256", "96"])
def test_each_jobs_own_profile_predicts_its_rate_with_the_epoch_start(width):
    r = REPORTS[width]
    m = Model.from_report(r)
    observed = r["rates_per_s"]["observed"]
    with_start = m.predict_measured()
    steady = replace(m, epoch_start_s=0.0).predict_measured()
    assert with_start.steady == pytest.approx(steady.samples_per_s)
    assert with_start.bound == steady.bound  # bounds are judged between epoch starts
    assert abs(with_start.samples_per_s / observed - 1) < 0.10  # -2.9%, +9.9%, +2.6%
    if width != "512":  # the lighter jobs: an epoch start is a larger share of a shorter epoch
        assert steady.samples_per_s / observed - 1 > 0.25  # +27.6%, +26.9% without it


def test_the_epoch_start_is_charged_once_an_epoch():
    m = Model.from_report(REPORTS["96"])
    p = m.predict_measured()
    assert p.epoch_s == pytest.approx(m.epoch_items / p.steady + m.epoch_start_s)
    assert p.samples_per_s == pytest.approx(m.epoch_items / p.epoch_s)
    longer = replace(m, epoch_items=10 * m.epoch_items).predict_measured()  # 10x the samples a start
    assert p.samples_per_s < longer.samples_per_s < p.steady


def test_reaching_compute_bound_is_judged_between_epoch_starts():
    # The heavy job is compute-bound: its prediction with epoch starts is below the compute rate, yet the
    # search must still find it there (no cache, core count or storage speed raises an epoch start).
    m = Model.from_report(REPORTS["512"])
    p = m.predict_measured()
    assert p.bound == "compute" and p.samples_per_s < m.compute_rate() * 0.99
    need = search.to_compute_bound(m)
    assert need["cpus_needed"] is not None and need["cpus_needed"] <= m.cpus
    assert need["storage_bytes_per_s_needed"] is not None

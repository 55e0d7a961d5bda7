"""Skew is named, and in_order=False offered, only when the replayed in-order loss reaches the threshold."""

from __future__ import annotations

import numpy as np

from dsanalyzer.judge import skew
from dsanalyzer.judge.verdict import verdict
from dsanalyzer.model.skew import in_order_loss, spread_summary
from dsanalyzer.model.whatif import Model
from dsanalyzer.report.schema import attach_model
from dsanalyzer.report.text import summary_text
from tests.dsanalyzer.judge.test_verdict import FAST_STORAGE, at_model_rate, base

HEAVY = [0.001] * 56 + [0.1] * 8
UNIFORM = np.linspace(0.9e-3, 1.1e-3, 64).tolist()


def _prep_bound(times: list[float], **loader) -> dict:
    """Prep-bound past this machine's 2 cores (no local fix), with a measured spread of ``times``."""
    rep = at_model_rate(base(fetch=FAST_STORAGE, cache_bytes=1e9))
    rep["prep_spread"] = {**spread_summary(times), "cpu_s": times, "seed": 0}
    rep["loader"] = {"num_workers": 2, "prefetch_factor": 2, **loader}
    return rep


def test_a_heavy_tail_that_binds_is_named_with_the_in_order_remedy():
    rep = _prep_bound(HEAVY)
    loss = in_order_loss(HEAVY, rep["batch_size"], 2)["loss"]
    assert loss >= skew.SKEW_LOSS  # the premise: over the threshold at batch 32, 2 workers
    v = verdict(rep)
    assert v["bound"] == "prep" and v["skew"]["binds"] and v["skew"]["loss"] == loss
    assert "skewed prep binds" in v["sentence"] and f"loses {loss:.0%}" in v["sentence"]
    r = next(r for r in v["remedies"] if r["name"] == "in_order")
    assert r["loader_args"] == {"in_order": False} and r["code"] == "DataLoader(..., in_order=False)"
    model = Model.from_report(rep)
    now = model.predict(model.cache_bytes, model.cpus, model.storage_bytes_per_s, policy=model.cache_policy)
    assert r["samples_per_s"] == min(model.compute_rate(), now.samples_per_s / (1 - loss))
    assert r["switch_to"] == ""  # torch's own argument


def test_a_uniform_spread_is_one_line_of_the_text_report_and_no_remedy():
    rep = attach_model(_prep_bound(UNIFORM))
    v = rep["verdict"]
    assert v["skew"] is not None and not v["skew"]["binds"] and v["skew"]["loss"] < skew.SKEW_LOSS
    assert "skew" not in v["sentence"] and all(r["name"] != "in_order" for r in v["remedies"])
    line = next(x for x in summary_text(rep).splitlines() if x.startswith("per-sample prep"))
    assert "p99/p50 1.1x" in line and "under the 5% that names skew" in line


def test_no_remedy_when_the_loader_is_out_of_order_already_or_not_prep_bound():
    assert not verdict(_prep_bound(HEAVY, in_order=False))["skew"]["binds"]
    rep = _prep_bound(HEAVY)
    rep["prep_scaling"] = {"workers": [1, 2], "samples_per_s": [5000.0, 9000.0]}  # compute-bound
    v = verdict(at_model_rate(rep))
    assert v["bound"] == "compute" and not v["skew"]["binds"]
    assert all(r["name"] != "in_order" for r in v["remedies"])
    text = summary_text(attach_model(at_model_rate(rep)))
    assert "workers loses" in text and "(not prep-bound)" in text


def test_a_report_without_a_spread_reads_as_before():
    rep = at_model_rate(base(fetch=FAST_STORAGE, cache_bytes=1e9))
    v = verdict(rep)
    assert v["skew"] is None and all(r["name"] != "in_order" for r in v["remedies"])
    rep["prep_spread"] = {"error": "not a map-style dataset (no dataset[i] to time)"}
    rep = attach_model(rep)
    assert "per-sample prep spread: not measured (not a map-style dataset" in summary_text(rep)

"""The sample cache's what-if (``--sample-cache-gb G``): hits skip the fetch and the deterministic prefix."""

from __future__ import annotations

import math

import pytest

from dsanalyzer.model import sample_cache, stages
from dsanalyzer.model.whatif import Model
from tests.dsanalyzer.model.test_coordinate import FAST
from tests.dsanalyzer.model.test_whatif import synthetic_report

DET, RAND, READ, PER = 0.003, 0.001, 0.0002, 100_000.0  # CPU s per sample; bytes per cached sample


def report(**over) -> dict:
    """A prep-bound job, 1 worker on 2 cores, a worker's CPU 5 ms a sample (3 of them the prefix)."""
    rep = synthetic_report(
        workers=1,
        fetch=FAST,
        prep_scaling={
            "workers": [1, 2],
            "samples_per_s": [200.0, 390.0],
            "cpu_s_per_sample": [0.0051, 0.0051],
            "cpu_share": [1.0, 1.0],
            "cores": 2,
        },  # fmt: skip
        main_process={"receive_cpu_s_per_batch": 0.0032, "step_cpu_s_per_batch": 0.0, "step_device": "cuda"},
        remedy_probes={
            "sample_cache": {
                "det_cpu_s_per_sample": DET,
                "random_cpu_s_per_sample": RAND,
                "cached_sample_bytes": PER,
                "read_cpu_s_per_sample": READ,
            },
        },  # fmt: skip
    )
    return {**rep, **over}


def test_no_cache_is_the_plain_prediction():
    model = Model.from_report(report())
    plain = model.predict_measured()
    assert sample_cache.sample_cached(model, 0).prediction.samples_per_s == pytest.approx(plain.samples_per_s)


def test_the_cache_holds_at_most_the_dataset():
    model = Model.from_report(report())  # 10,000 items
    assert sample_cache.cached_share(model, 5e8) == (5000, 0.5)
    big = sample_cache.sample_cached(model, 1e12)
    assert big.cached_items == 10_000 and big.hit_ratio == 1.0
    assert big.memory_bytes == 10_000 * PER  # not the 1 TB asked for
    assert sample_cache.sample_cached(model, 2e12).prediction == big.prediction


def test_a_full_cache_leaves_only_the_random_tail():
    model = Model.from_report(report())
    full = sample_cache.sample_cached(model, 1e12)
    t_w = 0.0051 - 0.0032 / 32  # a worker's CPU per sample: the data path less the main process's receiving
    left = t_w - DET + READ
    assert full.random_share == pytest.approx(left / t_w)
    assert full.prediction.stage_rates["prep"] == pytest.approx(200.0 * t_w / left)  # 1 worker
    half = sample_cache.sample_cached(model, 5e8)  # half the samples hit
    assert half.prediction.stage_rates["prep"] == pytest.approx(200.0 * t_w / (t_w - 0.5 * (DET - READ)))
    assert (
        model.predict_measured().samples_per_s < half.prediction.samples_per_s < full.prediction.samples_per_s
    )


def test_a_hit_reads_no_item():
    """Fetch-bound on slow storage: only the misses read, so a full cache removes the fetch stage."""
    rep = report(fetch={"bytes_per_s": 5e6, "items_per_s": 50.0})
    model = Model.from_report(rep)
    assert model.predict_measured().bound == "fetch"
    half = sample_cache.sample_cached(model, 5e8).prediction
    plain = stages.steady(model, stages.point_at(model))
    assert half.stage_rates["fetch"] == pytest.approx(2 * plain.stage_rates["fetch"])
    assert math.isinf(sample_cache.sample_cached(model, 1e12).prediction.stage_rates["fetch"])


def test_remedy_and_an_unmeasured_split():
    model = Model.from_report(report())
    r = sample_cache.remedy(model, 2e9)
    assert r.name == "sample_cache" and r.loader_args == {"sample_cache": "memcache.LocalStore(2000000000)"}
    assert r.cost == {"memory_bytes": 1e9} and r.samples_per_s and r.samples_per_s > 0
    rep = report(remedy_probes={"sample_cache": {"not_measured": "the source does not split its prep"}})
    r = sample_cache.remedy(Model.from_report(rep), 2e9)
    assert r.samples_per_s is None and r.why_unknown == "the source does not split its prep"
    with pytest.raises(ValueError, match="does not split"):
        sample_cache.sample_cached(Model.from_report(rep), 2e9)

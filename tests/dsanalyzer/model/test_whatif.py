"""The what-if model: stage arithmetic, bound attribution, prep scaling fit, grid and the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dsanalyzer.judge.verdict import advice_sentence
from dsanalyzer.model import search
from dsanalyzer.model.cache import lru_hit_ratio
from dsanalyzer.model.scaling import PrepScaling
from dsanalyzer.model.whatif import Model
from dsanalyzer.whatif_cli import main as whatif_main


def synthetic_report(**over) -> dict:
    """A schema-1 report with round numbers (what `dsa`'s profile writes), for tests that need one."""
    rng = np.random.default_rng(1)
    iters = 40
    report = {
        "schema_version": 1,
        "created": "2026-11-22T18:00:00Z",
        "command": ["python", "train.py"],
        "machine": {
            "cpus": 2,
            "memory_bytes": 24e9,
            "storage_device": "vda",
            "mem_bandwidth_bytes_per_s": 10e9,
        },
        "dataset": {"items": 10_000, "bytes": 1e9, "avg_item_bytes": 1e5, "path": "/data/train"},
        "batch_size": 32,
        "workers": 2,
        "cache_bytes": 3e8,
        "cache_policy": "pagecache",
        "rates_per_s": {"compute": 800.0, "prep": 380.0, "fetch": 500.0, "observed": 370.0},
        "prep_scaling": {"workers": [1, 2], "samples_per_s": [200.0, 380.0]},
        "fetch": {"bytes_per_s": 50e6, "items_per_s": 500.0},
        "per_iter_s": {"compute": 0.04, "prep_stall": 0.044, "fetch_stall": 0.002},
        "per_iter_spread_s": {
            k: {"p10": 0.9 * v, "p90": 1.1 * v}
            for k, v in {"compute": 0.04, "prep_stall": 0.044, "fetch_stall": 0.002}.items()
        },
        "per_epoch_s": {"compute": 12.5, "prep_stall": 13.75, "fetch_stall": 0.6, "total": 26.85},
        "bound": "prep",
        "advice": "",
        "whatif": {"grid": [], "to_compute_bound": {}},
        "runs": {
            name: {
                "iters": iters,
                "wait_s": (rng.random(iters) * w).tolist(),
                "step_s": (0.04 + rng.random(iters) * 0.002).tolist(),
                "samples_per_s": sps,
            }
            for name, w, sps in (
                ("compute", 0.0, 800.0),
                ("prep", 0.09, 380.0),
                ("fetch", 0.1, 370.0),
                ("real", 0.1, 370.0),
            )
        },
        "sysmon": {
            "t_s": [0.5 * i for i in range(20)],
            "cpu_percent_per_core": [[50 + 40 * math.sin(i / 3), 60.0] for i in range(20)],
            "disk_read_bytes": [i * 5e6 for i in range(20)],
            "page_cache_bytes": [1e9 + i * 1e7 for i in range(20)],
        },
    }
    report.update(over)
    return report


def test_compute_bound_when_everything_else_is_fast():
    m = Model.from_report(synthetic_report(prep_scaling={"workers": [1], "samples_per_s": [5000.0]}, runs={}))
    p = m.predict(cache_bytes=1e9, cpus=2, storage_bytes_per_s=1e9, policy="minio")
    assert p.bound == "compute"
    assert p.samples_per_s == pytest.approx(800.0)
    assert p.epoch_s == pytest.approx(10_000 / 800.0)
    assert p.per_iter_s["prep_stall"] == pytest.approx(0) and p.per_iter_s["fetch_stall"] == pytest.approx(0)


def test_fetch_stage_formula_and_fetch_bound():
    m = Model.from_report(synthetic_report())
    s, membw, bw = 1e5, 10e9, 20e6
    p = m.predict(cache_bytes=5e8, cpus=16, storage_bytes_per_s=bw, policy="minio")
    h = 0.5
    assert p.hit_ratio == pytest.approx(h)
    assert p.stage_rates["fetch"] == pytest.approx(1 / (h * s / membw + (1 - h) * s / bw))
    assert p.bound == "fetch"
    assert p.samples_per_s == pytest.approx(min(p.stage_rates.values()))
    # stalls add up to the predicted time per iteration
    total = sum(p.per_iter_s.values())
    assert total == pytest.approx(32 / p.samples_per_s)


def test_pagecache_predicts_less_than_minio_for_a_partial_cache():
    m = Model.from_report(synthetic_report())
    lru = m.predict(5e8, 16, 20e6, policy="pagecache")
    minio = m.predict(5e8, 16, 20e6, policy="minio")
    assert lru.hit_ratio == pytest.approx(lru_hit_ratio(0.5, 1.0))
    assert lru.samples_per_s < minio.samples_per_s


def test_worker_cycle_serialises_fetch_and_prep_per_worker():
    # one worker, fetch 2 ms/item (storage not saturated), prep 5 ms/item: 1 / 7 ms
    rep = synthetic_report(
        prep_scaling={"workers": [1], "samples_per_s": [200.0]},
        machine={"cpus": 1, "mem_bandwidth_bytes_per_s": None},
        workers=1,
    )
    m = Model.from_report(rep)
    p = m.predict(0, cpus=1, storage_bytes_per_s=50e6, policy="minio")
    assert p.stage_rates["worker_cycle"] == pytest.approx(1 / 0.007)
    assert p.bound == "fetch"  # the gap to the in-memory prep rate is a fetch stall


def test_prep_bound_and_cores_needed():
    m = Model.from_report(synthetic_report())
    p = m.predict(1e9, cpus=2, storage_bytes_per_s=1e12, policy="minio")
    assert p.bound == "prep"
    need = search.to_compute_bound(m)
    assert need["cpus_needed"] is not None
    assert m.prep.rate(need["cpus_needed"]) >= 800 * (1 - 1e-9)
    assert m.prep.rate(need["cpus_needed"] - 1) < 800


def test_cache_needed_for_compute_bound_is_minimal_and_pagecache_needs_more():
    rep = synthetic_report(prep_scaling={"workers": [1], "samples_per_s": [5000.0]}, runs={})
    m = Model.from_report(rep)
    need = search.to_compute_bound(m)
    minio, page = need["cache_bytes_needed"]["minio"], need["cache_bytes_needed"]["pagecache"]
    assert 0 < minio < page <= 1e9
    assert m.predict(minio, 2, 50e6, policy="minio").bound == "compute"
    assert m.predict(minio * 0.98, 2, 50e6, policy="minio").bound == "fetch"
    assert "cache_bytes=" in advice_sentence(dict(rep, bound="fetch"))
    assert need["storage_bytes_per_s_needed"] > 50e6


def test_gpu_speedup_scales_compute():
    m = Model.from_report(synthetic_report(prep_scaling={"workers": [1], "samples_per_s": [1e5]}, runs={}))
    assert m.predict(1e9, 2, 1e12, gpu_speedup=2.0).stage_rates["compute"] == pytest.approx(1600)


def test_main_process_batch_overhead_is_its_measured_cpu_not_run_2s_wall_time():
    # run 2 (items from memory) at 640/s although G = 800: its wall time alone infers no per-batch cost
    rep = synthetic_report(prep_scaling={"workers": [1, 2], "samples_per_s": [3000.0, 6000.0]})
    rep["runs"]["prep"]["samples_per_s"] = 640.0
    assert Model.from_report(rep).batch_overhead_s == 0.0
    # the main thread's own CPU per batch, measured inside __next__: 10 ms per batch of 32 on top of the step
    rep["main_process"] = {"receive_cpu_s_per_batch": 0.010, "step_cpu_s_per_batch": 0.001}
    m = Model.from_report(rep)
    assert m.batch_overhead_s == pytest.approx(0.010)
    p = m.predict(1e9, 2, 1e12, policy="minio")
    assert p.bound == "compute" and p.samples_per_s == pytest.approx(1 / (1 / 800 + 0.010 / 32))
    assert p.per_iter_s["compute"] == pytest.approx(0.04)  # the step; the overhead shows as prep stall
    assert p.per_iter_s["prep_stall"] == pytest.approx(0.01)


def one_cpu_prep_bound_report() -> dict:
    """A job profiled on 1 CPU: one worker preps at 900/s, the step alone runs at 12,000/s; the worker
    and the main process share the core, so run 2 (items from memory) is slow in wall time."""
    rep = synthetic_report(
        machine={"cpus": 1, "memory_bytes": 24e9, "mem_bandwidth_bytes_per_s": 10e9},
        workers=1,
        rates_per_s={"compute": 12000.0, "prep": 900.0, "fetch": 5000.0, "observed": 830.0},
        prep_scaling={
            "workers": [1],
            "samples_per_s": [900.0],
            "cores": 1,
            "cpu_s_per_sample": [1 / 900],
            "cpu_share": [1.0],
        },  # fmt: skip
        main_process={"receive_cpu_s_per_batch": 0.0003, "step_cpu_s_per_batch": 32 / 12000},
        fetch={"bytes_per_s": 1e9, "items_per_s": 1e4},
        cache_bytes=2e9,
    )
    rep["runs"]["prep"]["samples_per_s"] = 830.0
    return rep


def test_one_cpu_profile_charges_the_step_to_the_shared_core_and_more_cores_help():
    m = Model.from_report(one_cpu_prep_bound_report())
    one = m.predict(2e9, 1, 1e9, policy="pagecache", workers=1)
    # on one core the worker's prep and the main process's step take turns: 1/(1/900 + 1/12000)
    assert one.samples_per_s == pytest.approx(1 / (1 / 900 + 1 / 12000), rel=1e-6)
    assert one.bound == "prep"
    two = m.predict(2e9, 2, 1e9, policy="pagecache", workers=2)
    assert two.bound == "prep" and two.samples_per_s == pytest.approx(2 * one.samples_per_s, rel=1e-6)
    # the ceiling is the step plus the main process's own receive CPU, not the 1-CPU wall rate
    assert m.compute_rate() == pytest.approx(1 / (1 / 12000 + 0.0003 / 32))
    assert m.cores_for_rate(m.compute_rate()) == 13  # 13 x 837/s >= 10,784/s


def test_cpu_share_turns_cpu_seconds_into_this_machines_wall_seconds():
    rep = one_cpu_prep_bound_report()
    rep["prep_scaling"]["cpu_share"] = [0.5]  # other processes held half the core
    m = Model.from_report(rep)
    assert m.cpu_share == 0.5
    assert m.cpu_rate(2) == pytest.approx(0.5 * 2 / (1 / 900 + 1 / 12000))


def test_workers_zero_loads_in_series_with_the_step():
    rep = synthetic_report(prep_scaling={"workers": [1], "samples_per_s": [200.0]}, workers=0, runs={})
    m = Model.from_report(rep)
    p = m.predict(1e9, 2, 1e12, policy="minio", workers=0)
    hit_s = 1e5 / 10e9
    assert p.samples_per_s == pytest.approx(1 / (1 / 800 + hit_s + 1 / 200))
    assert p.bound == "prep"


def test_usl_fit_recovers_known_parameters():
    truth = PrepScaling(rate_one_core_per_s=100.0, sigma=0.05, kappa=0.002)
    ks = [1, 2, 4, 8]
    fit = PrepScaling.fit(ks, [truth.rate(k) for k in ks])
    assert fit.rate_one_core_per_s == pytest.approx(100, rel=1e-6)
    assert fit.sigma == pytest.approx(0.05, rel=1e-6) and fit.kappa == pytest.approx(0.002, rel=1e-6)
    assert fit.rate(32) == pytest.approx(fit.max_rate())  # past the peak: the peak


def test_scaling_is_not_a_straight_line_and_ignores_oversubscribed_points():
    fit = PrepScaling.fit([1, 2, 3], [200.0, 360.0, 300.0], physical_cores=2)
    assert fit.fitted_points == 2
    assert fit.sigma > 0
    assert fit.rate(8) < 8 * 200


def test_bad_reports_name_the_field():
    rep = synthetic_report()
    del rep["fetch"]
    with pytest.raises(ValueError, match="fetch.bytes_per_s"):
        Model.from_report(rep)
    with pytest.raises(ValueError, match="cache_policy"):
        Model.from_report(synthetic_report(cache_policy="lfu"))
    with pytest.raises(ValueError, match="pair up"):
        PrepScaling.fit([1, 2], [100.0])


def test_grid_rows_have_contract_keys():
    m = Model.from_report(synthetic_report())
    rows = search.grid(m, cache_bytes=[0, 1e9], cpus=[1, 4], storage_bytes_per_s=[1e8])
    assert len(rows) == 2 * 2 * 1 * 2
    for row in rows:
        assert {
            "cache_bytes",
            "cpus",
            "storage_bytes_per_s",
            "policy",
            "samples_per_s",
            "epoch_s",
            "bound",
        } <= set(row)
    # strict JSON: no NaN or Infinity may leak into report.json
    json.dumps(
        {"model": m.params(), "whatif": {"grid": rows, "to_compute_bound": search.to_compute_bound(m)}},
        allow_nan=False,
    )


def test_advice_when_prep_saturates():
    rep = synthetic_report(prep_scaling={"workers": [1, 2], "samples_per_s": [200.0, 210.0]}, bound="prep")
    need = search.to_compute_bound(Model.from_report(rep))
    assert need["cpus_needed"] is None and need["prep_max_samples_per_s"] < 800
    assert "prep saturates" in advice_sentence(rep)
    assert "5 CPU cores" in advice_sentence(synthetic_report(bound="prep"))


def test_cli_last_line_is_the_prediction(tmp_path, capsys):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(synthetic_report()))
    assert (
        whatif_main(
            [
                str(path),
                "--cache-gb",
                "0.5",
                "--cpus",
                "16",
                "--storage-mbps",
                "20",
                "--cache-policy",
                "minio",
            ]
        )
        == 0
    )
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("predicted_samples_per_s=")
    expect = Model.from_report(synthetic_report()).predict(5e8, 16, 20e6, policy="minio").samples_per_s
    assert float(last.split("=", 1)[1]) == pytest.approx(expect, rel=1e-5)


def test_cli_rejects_an_old_report(tmp_path, capsys):
    path = tmp_path / "old.json"
    path.write_text(json.dumps(synthetic_report(schema_version=0)))
    assert whatif_main([str(path)]) != 0
    err = capsys.readouterr().err
    assert "old.json" in err and "schema_version" in err


def test_epoch_counts_this_ranks_share_under_a_distributed_sampler():
    rep = synthetic_report(prep_scaling={"workers": [1], "samples_per_s": [5000.0]}, runs={})
    whole = Model.from_report(rep).predict(1e9, 2, 1e9, policy="minio")
    rep["loader"] = {"batches_per_epoch": 157}  # ceil(10,000 / 2 ranks / 32)
    half = Model.from_report(rep).predict(1e9, 2, 1e9, policy="minio")
    assert half.samples_per_s == whole.samples_per_s
    assert half.epoch_s == pytest.approx(157 * 32 / whole.samples_per_s)


def test_a_dataset_that_reads_no_files_gets_a_whatif_with_fetch_free():
    rep = synthetic_report(prep_scaling={"workers": [1, 2], "samples_per_s": [300.0, 580.0]}, runs={})
    rep["dataset"] = {"items": 10_000, "bytes": 0, "avg_item_bytes": 0.0, "reads_no_files": True}
    rep["fetch"] = {"error": "measure_fetch_rate needs dataset files or an item source with fetch()"}
    m = Model.from_report(rep)
    assert m.fetch_free and m.params()["storage_bytes_per_s"] is None
    p = m.predict(0, 2, m.storage_bytes_per_s, policy="pagecache")
    assert p.bound == "prep" and p.samples_per_s == pytest.approx(580.0) and p.hit_ratio == 1.0
    rows = search.grid(m)
    assert rows and all(r["storage_bytes_per_s"] is None for r in rows)
    json.dumps(rows, allow_nan=False)  # strict JSON
    assert search.to_compute_bound(m)["cpus_needed"] == 3

"""The verdict follows from the numbers: each bound, agreement, and disagreement with measured causes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dsanalyzer.judge.verdict import PARTIAL_MINIO_NOTE, rate_spread, recommend, verdict, workers_noun
from dsanalyzer.model.whatif import Model
from tests.dsanalyzer.model.test_whatif import synthetic_report

FAST_STORAGE = {"bytes_per_s": 1e12, "items_per_s": None}


def base(**over) -> dict:
    """The synthetic report with no per-batch overhead (its in-memory run is not a measurement here)."""
    rep = synthetic_report(**over)
    rep["runs"] = {**rep["runs"], "prep": {**rep["runs"]["prep"], "samples_per_s": None}}
    return rep


def with_real_run(rep: dict, observed: float, iters: int = 40, jitter: float = 0.0, seed: int = 0) -> dict:
    """``rep`` whose real run delivered ``observed`` samples/s, iteration times spread by ``jitter``."""
    rng = np.random.default_rng(seed)
    t = rep["batch_size"] / observed * (1 + jitter * rng.uniform(-1, 1, iters))
    runs = dict(
        rep["runs"], real={"iters": iters, "wait_s": (t * 0.5).tolist(), "step_s": (t * 0.5).tolist()}
    )
    return dict(rep, runs=runs, warmup_iters=0, rates_per_s=dict(rep["rates_per_s"], observed=observed))


def at_model_rate(rep: dict, **kw) -> dict:
    """``rep`` with a real run at exactly the model's prediction for the measured configuration."""
    return with_real_run(rep, Model.from_report(rep).predict_measured().samples_per_s, **kw)


def test_compute_bound_agrees_and_asks_for_nothing():
    rep = at_model_rate(
        base(prep_scaling={"workers": [1, 2], "samples_per_s": [5000.0, 9000.0]}, fetch=FAST_STORAGE)
    )
    v = verdict(rep)
    assert v["bound"] == "compute" and not v["disagrees"] and v["fix"] is None
    assert v["sentence"].startswith("compute-bound") and "will not help" in v["sentence"]


def test_prep_bound_names_the_worker_count_that_fixes_it():
    rep = base(
        machine={"cpus": 8, "memory_bytes": 24e9, "mem_bandwidth_bytes_per_s": 10e9},
        prep_scaling={"workers": [1, 2, 4], "samples_per_s": [150.0, 300.0, 600.0]},
        fetch=FAST_STORAGE,
        cache_bytes=1e9,
    )
    v = verdict(at_model_rate(rep))
    assert v["bound"] == "prep" and not v["disagrees"]
    workers = v["fix"]["change"]["num_workers"]
    model = Model.from_report(rep)
    assert model.prep.rate(workers) >= model.compute_rate() * (1 - 1e-6) > model.prep.rate(workers - 1)
    assert f"num_workers={workers}" in v["sentence"] and v["fix"]["bound"] == "compute"


def test_prep_bound_beyond_this_machine_says_how_many_cores():
    v = verdict(at_model_rate(base(fetch=FAST_STORAGE, cache_bytes=1e9)))
    assert v["bound"] == "prep" and v["fix"] is None
    assert "5 CPU cores" in v["sentence"] and "this machine has 2" in v["sentence"]


def test_fetch_bound_names_a_cache_and_its_predicted_rate():
    rep = base(prep_scaling={"workers": [1, 2], "samples_per_s": [5000.0, 9000.0]})
    v = verdict(at_model_rate(rep))
    assert v["bound"] == "fetch" and not v["disagrees"]
    cache = v["fix"]["change"]["cache_bytes"]
    model = Model.from_report(rep)
    assert model.predict(cache, 2, 50e6, policy="minio", workers=2).bound == "compute"
    assert v["fix"]["predicted_samples_per_s"] == pytest.approx(model.compute_rate())
    assert f"coordl.DataLoader(..., cache_bytes={cache})" in v["sentence"]
    # a partial MinIO cache: the benchmark's measured bias is stated with the fix
    assert cache < model.dataset_bytes and v["fix"]["note"] == PARTIAL_MINIO_NOTE
    assert "0.5-8.3% below the what-if on a quiet machine" in v["sentence"]


_DALI_ITER = {"class": "nvidia.dali.plugin.pytorch.DALIGenericIterator", "pipelines": 1}
_DALI_LOADER = {"class": "coordl.dali.loader.DALILoader", "pipelines": 1}


@pytest.mark.parametrize(
    ("loader", "code"),
    [
        (_DALI_ITER, "Pipeline(..., num_threads={w})"),
        (_DALI_LOADER, "coordl.dali.DALILoader(..., num_threads={w})"),
        ({"class": "coordl.dataloader.DataLoader"}, "DataLoader(..., num_workers={w})"),
    ],
)
def test_a_dali_job_is_told_num_threads_not_num_workers(loader, code):
    rep = base(
        machine={"cpus": 8, "memory_bytes": 24e9, "mem_bandwidth_bytes_per_s": 10e9},
        prep_scaling={"workers": [1, 2, 4], "samples_per_s": [150.0, 300.0, 600.0]},
        fetch=FAST_STORAGE,
        cache_bytes=1e9,
    )
    v = verdict(at_model_rate(dict(rep, loader=loader)))
    workers = v["fix"]["change"]["num_workers"]  # the key verify reads, whatever the loader calls it
    assert v["fix"]["code"] == code.format(w=workers) and v["fix"]["code"] in v["sentence"]


def test_a_dali_job_with_a_fetch_stall_is_pointed_at_coordls_dali_loader():
    rep = base(prep_scaling={"workers": [1, 2], "samples_per_s": [5000.0, 9000.0]}, loader=_DALI_ITER)
    v = verdict(at_model_rate(rep))
    cache = v["fix"]["change"]["cache_bytes"]
    assert v["fix"]["code"] == f"coordl.dali.DALILoader(..., cache_bytes={cache})"


def test_disagreement_with_a_cold_cache_is_named_with_the_numbers():
    rep = base(prep_scaling={"workers": [1, 2], "samples_per_s": [5000.0, 9000.0]}, cache_bytes=5e8)
    predicted = Model.from_report(rep).predict_measured()
    assert predicted.hit_ratio > 0.05
    v = verdict(with_real_run(rep, 0.5 * predicted.samples_per_s))
    assert v["disagrees"] and v["gap"] == pytest.approx(-0.5)
    assert v["bound"] == "fetch"  # the model's bound, not the run's
    assert any(c.startswith("cold cache: the real run read 1280 of 10000 items") for c in v["causes"])
    assert "-50%" in v["sentence"]


def test_disagreement_with_interference_from_other_processes():
    rep = base(prep_scaling={"workers": [1, 2], "samples_per_s": [5000.0, 9000.0]}, cache_bytes=0)
    rep["sysmon"] = {
        "other_cpu_cores": [None, 1.2, 1.0, 0.0, 0.0],
        "runs": [{"run": "prep", "samples": 2}, {"run": "real", "samples": 3}],
    }
    v = verdict(with_real_run(rep, 0.7 * Model.from_report(rep).predict_measured().samples_per_s))
    assert v["disagrees"]
    assert v["causes"] == ["interference: other processes used 0.33 of the 2 cores during the real run"]


def test_disagreement_without_a_measured_cause_says_so():
    rep = base(prep_scaling={"workers": [1, 2], "samples_per_s": [5000.0, 9000.0]}, cache_bytes=0)
    v = verdict(with_real_run(rep, 0.7 * Model.from_report(rep).predict_measured().samples_per_s))
    assert v["disagrees"] and v["causes"] == []
    assert "none of the measured causes shows" in v["sentence"]


def test_a_gap_inside_the_runs_own_spread_is_agreement():
    rep = base(prep_scaling={"workers": [1, 2], "samples_per_s": [5000.0, 9000.0]}, cache_bytes=0)
    predicted = Model.from_report(rep).predict_measured().samples_per_s
    v = verdict(with_real_run(rep, 0.9 * predicted, jitter=0.5, seed=3))
    assert not v["disagrees"] and abs(v["gap"]) <= v["spread"]
    assert "agrees" in v["sentence"]


def test_a_short_noisy_run_that_disagrees_is_too_few_iterations():
    rep = base(prep_scaling={"workers": [1, 2], "samples_per_s": [5000.0, 9000.0]}, cache_bytes=0)
    predicted = Model.from_report(rep).predict_measured().samples_per_s
    noisy = with_real_run(rep, 0.4 * predicted, iters=16, jitter=0.9, seed=3)
    spread = rate_spread(noisy)
    assert spread["blocks"] == 4 and (spread["p90"] - spread["p10"]) / 2 / spread["median"] > 0.15
    v = verdict(noisy)
    assert v["disagrees"] and v["causes"][0].startswith("too few iterations")


def test_per_batch_overhead_is_named_when_it_caps_the_job():
    rep = base(
        prep_scaling={"workers": [1, 2], "samples_per_s": [5000.0, 9000.0]},
        fetch=FAST_STORAGE,
        cache_bytes=1e9,
    )
    # the main thread's own CPU per batch receiving it: 40 ms, as long as the step itself
    rep["main_process"] = {"receive_cpu_s_per_batch": 32 / 400 - 32 / 800, "step_cpu_s_per_batch": 0.001}
    rep = at_model_rate(rep)
    v = verdict(rep)
    assert v["overhead"]["batch_overhead_s"] == pytest.approx(32 / 400 - 32 / 800)
    assert "tops out at 400 samples/s" in v["sentence"] and "800 samples/s" in v["sentence"]
    assert recommend(Model.from_report(rep)) is None
    assert not v["more_cores"]["rises"] and "will not help" in v["sentence"]


def test_bounds_that_differ_are_explained_with_numbers_and_the_stalls_win_an_unexplained_miss():
    rep = base(
        prep_scaling={"workers": [1, 2], "samples_per_s": [5000.0, 9000.0]},
        fetch=FAST_STORAGE,
        cache_bytes=1e9,
    )
    rep["bound"] = "prep"  # the stalls as measured: prep stall 44 ms of an 86 ms iteration
    v = verdict(at_model_rate(rep))  # the model (compute) matches the real run: its bound stands
    assert v["bound"] == v["model_bound"] == "compute" and v["measured_bound"] == "prep"
    assert (
        "the stalls as measured name prep (prep stall 44.0 ms, fetch stall 2.0 ms of a 86.0 ms"
        in v["sentence"]
    )
    miss = verdict(with_real_run(rep, 300.0, iters=400))  # a miss by far that nothing measured explains
    assert miss["disagrees"] and not miss["causes"]
    assert miss["bound"] == "prep" and miss["model_bound"] == "compute"
    assert miss["sentence"].startswith("prep-bound") and "will not help" not in miss["sentence"]
    assert "so the verdict follows the stalls" in miss["sentence"]


def test_a_dali_job_reads_num_threads_in_the_verdict_and_on_the_html_cores_axis():
    from dsanalyzer.report import html

    rep = base(prep_scaling={"workers": [1, 2], "samples_per_s": [150.0, 160.0]}, loader=_DALI_ITER)
    noun = workers_noun(rep)
    assert "num_threads" in noun and "num_workers" not in noun
    fig = html._whatif_cores(Model.from_report(rep), noun)
    assert "num_threads" in fig.axes[0].get_xlabel()
    assert "num_workers" not in verdict(at_model_rate(rep))["sentence"]


def test_more_cores_names_torchs_intra_op_threads_when_they_are_its_default():
    from tests.dsanalyzer.model.test_whatif import one_cpu_prep_bound_report

    rep = one_cpu_prep_bound_report()
    # torch's default on the 1 CPU it was profiled on: on 2 cores it runs 2 threads beside the workers
    rep["main_process"].update(torch_threads=1, threads_follow_cores=True, step_device="cpu")
    v = verdict(at_model_rate(rep))
    assert v["bound"] == "prep" and v["more_cores"]["rises"]
    note = v["more_cores"]["note"]
    assert "torch.set_num_threads(1)" in note and note in v["sentence"]
    m = Model.from_report(rep)
    one = replace(m, threads_follow_cores=False).predict(2e9, 2, 1e9, policy="pagecache", workers=2)
    assert f"{v['more_cores']['samples_per_s']:,.0f} samples/s" in note  # the prediction counts the spin
    assert (
        f"would give {one.samples_per_s:,.0f} samples/s" in note
        and one.samples_per_s > v["more_cores"]["samples_per_s"]
    )
    rep["main_process"].update(torch_threads=1, threads_follow_cores=False)  # fixed by the script: no spin
    assert verdict(at_model_rate(rep))["more_cores"]["note"] is None
    rep["main_process"].update(threads_follow_cores=True, step_device="cuda")  # a GPU step: threads asleep
    assert verdict(at_model_rate(rep))["more_cores"]["note"] is None

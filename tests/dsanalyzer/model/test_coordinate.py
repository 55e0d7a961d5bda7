"""Coordinated prep's what-if (``--jobs K``): one fetch+prep per batch for K jobs, each paying its own step."""

from __future__ import annotations

import math

import pytest

from dsanalyzer.model import coordinate, stages
from dsanalyzer.model.whatif import Model
from tests.dsanalyzer.model.test_whatif import synthetic_report

FAST = {"bytes_per_s": 50e9, "items_per_s": 500_000.0}


def report(cpus: int = 8, **over) -> dict:
    """A prep-bound job (prep 200 samples/s a core) with the CPU it costs and the coordinate probe."""
    rep = synthetic_report(
        machine={"cpus": cpus, "memory_bytes": 24e9, "mem_bandwidth_bytes_per_s": 10e9},
        workers=1,
        fetch=FAST,
        prep_scaling={
            "workers": list(range(1, cpus + 1)),
            "samples_per_s": [200.0 * k for k in range(1, cpus + 1)],
            "cpu_s_per_sample": [0.0051] * cpus,
            "cpu_share": [1.0] * cpus,
            "cores": cpus,
        },
        main_process={"receive_cpu_s_per_batch": 0.0032, "step_cpu_s_per_batch": 0.0, "step_device": "cuda"},
        remedy_probes={"coordinate": {"batch_bytes": 1_000_000, "receive_cpu_s_per_batch": 0.001}},
        epoch_start={"s_per_epoch": 0.5},
        rates_per_s={"compute": 2000.0, "prep": 200.0, "fetch": 500_000.0, "observed": 190.0},
    )
    return {**rep, **over}


def test_one_job_uncoordinated_is_the_plain_prediction():
    model = Model.from_report(report())
    point = stages.point_at(model, cpus=4, workers=2)
    plain = model.predict(point.cache_bytes, 4, point.storage_bytes_per_s, policy=point.policy, workers=2)
    one = coordinate.coordinated(model, 1, point)
    assert one.uncoordinated.samples_per_s == pytest.approx(plain.samples_per_s, rel=1e-9)
    assert one.uncoordinated.bound == plain.bound
    # coordinated, one job makes its batches alone: its steady rate, with no epoch start (producers persist)
    assert one.per_job.samples_per_s == pytest.approx(plain.steady, rel=0.01)


def test_k_jobs_share_the_prep_that_k_independent_jobs_each_repeat():
    model = Model.from_report(report())
    k4 = coordinate.coordinated(model, 4)  # 1 worker each: 4 producers on 8 cores, prep 800 samples/s
    assert k4.producers == 4
    assert k4.per_job.bound == "prep"
    assert k4.per_job.samples_per_s == pytest.approx(800.0, rel=0.02)
    assert k4.aggregate_per_s == pytest.approx(4 * k4.per_job.samples_per_s)
    # independently, each job preps every item: the same 4 workers' 800 samples/s split four ways
    assert k4.uncoordinated.samples_per_s == pytest.approx(800.0 / 4, rel=0.05)


def test_each_jobs_own_step_cpu_still_costs_cores():
    """A CPU step: every job pays its own step, so K jobs on 2 cores get less each as K grows."""
    rep = report(cpus=2)
    rep["main_process"] = {
        "receive_cpu_s_per_batch": 0.0,
        "step_cpu_s_per_batch": 0.032,
        "step_device": "cpu",
    }
    rep["prep_scaling"]["cpu_s_per_sample"] = [0.005, 0.005]
    rep["remedy_probes"]["coordinate"]["receive_cpu_s_per_batch"] = 0.0
    model = Model.from_report(rep)
    data, own = 0.005, 0.032 / 32  # CPU per sample: the data path once, the step once per job
    for k in (1, 2, 4):
        pred = coordinate.coordinated(model, k).per_job
        assert pred.stage_rates["cpu"] == pytest.approx(2 / (data + k * own), rel=1e-6)
    assert (
        coordinate.coordinated(model, 4).per_job.samples_per_s
        < coordinate.coordinated(model, 2).per_job.samples_per_s
    )


def test_memory_is_the_groups_ring_and_the_remedy_names_the_loader_argument():
    model = Model.from_report(report())
    assert coordinate.group_memory_bytes(model) == 8 * math.ceil(1_000_000 * 1.05)
    r = coordinate.remedy(model, 4, group="hpsearch")
    assert r.name == "coordinate" and r.loader_args == {"coordinate": "hpsearch"}
    assert r.cost == {"jobs": 4, "memory_bytes": 8 * 1_050_000}
    assert r.samples_per_s == pytest.approx(coordinate.coordinated(model, 4).per_job.samples_per_s)


def test_an_old_report_says_why_it_cannot_predict():
    rep = report()
    del rep["remedy_probes"]
    model = Model.from_report(rep)
    r = coordinate.remedy(model, 2)
    assert r.samples_per_s is None and "profile again" in r.why_unknown
    with pytest.raises(ValueError, match="jobs must be >= 1"):
        coordinate.coordinated(model, 0)


def test_the_slots_are_coordls():
    from coordl.coordinated.job import Group

    assert Group("x").slots == coordinate.DEFAULT_SLOTS


def test_the_producers_get_the_cores_other_processes_leave_not_the_profiled_loaders_share():
    # the loader alone kept 0.915 of 2 cores busy while other processes took 0.02 of a core: torch's
    # pipeline gaps are the rest, and the producers (a ring, no consumer to wait on) have none
    rep = report(cpus=2)
    rep["prep_scaling"]["cpu_share"] = [0.915, 0.915]
    job = Model.from_report(rep)
    assert job.cpu_share == pytest.approx(0.915)
    assert job.free_share is None  # no system monitor in this report: the share as profiled
    rep["sysmon"] = {
        "other_cpu_cores": [None, 0.02, 0.02, 0.5],
        "runs": [{"run": "prep_scaling", "samples": 3}],
    }
    freed = Model.from_report(rep)
    assert freed.free_share == pytest.approx(0.99)  # the prep-scaling run's samples only
    two, two_freed = coordinate.coordinated(job, 2), coordinate.coordinated(freed, 2)
    gain = max(1.0, 0.99 / job.cpu_share)
    assert two_freed.per_job.samples_per_s == pytest.approx(two.per_job.samples_per_s * gain, rel=0.02)
    # K jobs of their own keep torch's gaps: their rate does not move
    assert two_freed.uncoordinated.samples_per_s == pytest.approx(two.uncoordinated.samples_per_s)

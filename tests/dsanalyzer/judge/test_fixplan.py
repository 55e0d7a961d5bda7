"""``dsanalyzer fix``'s plan: the next step is the ranked list's first applicable remedy for the job with the
changes kept so far, so a change that moves the bound is followed by the remedy of the new bound."""

from __future__ import annotations

from dsanalyzer.fix import forced_step
from dsanalyzer.judge.fixplan import Config, next_step, plan
from dsanalyzer.judge.verdict import verdict
from tests.dsanalyzer.judge.test_remedy_list import compute_bound, fetch_bound_torch, spinning
from tests.dsanalyzer.judge.test_verdict import FAST_STORAGE, at_model_rate, base

_MACHINE = {"cpus": 4, "memory_bytes": 24e9, "mem_bandwidth_bytes_per_s": 10e9}
_MP = {"torch_threads": 4, "threads_follow_cores": True, "step_device": "cpu", "step_cpu_s_per_batch": 0.02}
_PS = {"workers": [1, 2, 3, 4], "samples_per_s": [300.0, 600.0, 900.0, 1150.0], "cpu_s_per_sample": [0.0025] * 4,
       "cpu_share": [1.0] * 4, "cores": 4}  # fmt: skip


def one_worker_spinning_threads() -> dict:
    """4 cores, 1 worker, torch's 4 threads in a CPU step: more workers first, then the threads bind."""
    rates = {"compute": 1000.0, "prep": 300.0, "fetch": 5000.0, "observed": 280.0}
    return at_model_rate(
        base(
            machine=_MACHINE,
            main_process=_MP,
            prep_scaling=_PS,
            fetch=FAST_STORAGE,
            cache_bytes=1e9,
            workers=1,
            rates_per_s=rates,
        )  # fmt: skip
    )


def test_a_change_that_moves_the_bound_is_followed_by_the_remedy_of_the_new_bound():
    rep = one_worker_spinning_threads()
    steps = plan(rep, 3, 8e9)
    assert [s.name for s in steps] == ["workers", "threads"]
    assert steps[0].loader_args == {"num_workers": 4} and not steps[0].removes_stall
    # the second is predicted for the job with 4 workers: one thread gives the workers their cores back
    assert steps[1].torch_threads == 1 and steps[1].removes_stall
    assert steps[1].predicted_samples_per_s > steps[0].predicted_samples_per_s * 1.2
    # the first step is the verdict's fix: fix and verdict agree
    assert verdict(rep)["fix"]["code"] == steps[0].code


def test_a_reverted_remedy_is_not_tried_again_and_the_next_one_is():
    rep = one_worker_spinning_threads()
    # threads alone gain nothing in the model here; with more workers reverted, one thread is still a trial
    # (4 threads and 1 worker outnumber the 4 cores: the contention the model has no term for)
    trial = next_step(rep, Config(), 8e9, frozenset({"workers"}))
    assert trial is not None and trial.name == "threads"
    assert trial.predicted_samples_per_s == verdict(rep)["predicted_samples_per_s"]
    assert next_step(rep, Config(), 8e9, frozenset({"workers", "threads"})) is None
    after = Config().with_step(plan(rep, 1, 8e9)[0])
    assert next_step(rep, after, 8e9, frozenset({"threads"})) is None


def test_no_thread_trial_where_the_profile_left_the_cores_idle():
    rep = one_worker_spinning_threads()
    cores = int(rep["machine"]["cpus"])
    busy = {"cpu_percent_per_core": [[100.0] * cores] * 4, "runs": [{"run": "real", "samples": 4}]}
    idle = {"cpu_percent_per_core": [[10.0] * cores] * 4, "runs": [{"run": "real", "samples": 4}]}
    step = next_step({**rep, "sysmon": busy}, Config(), 8e9, frozenset({"workers"}))
    assert step is not None and step.name == "threads"
    step = next_step({**rep, "sysmon": idle}, Config(), 8e9, frozenset({"workers"}))
    assert step is None or step.name != "threads"
    # a change kept since: the profile's idle cores no longer tell; a run with the change does
    kept = Config(loader_args={"prefetch_factor": 4})
    step = next_step({**rep, "sysmon": idle}, kept, 8e9, frozenset({"workers"}))
    assert step is not None and step.name == "threads"
    step = next_step({**rep, "sysmon": busy}, kept, 8e9, frozenset({"workers"}), idle_cores=0.1 * cores)
    assert step is not None and step.name == "threads"
    step = next_step({**rep, "sysmon": busy}, kept, 8e9, frozenset({"workers"}), idle_cores=0.9 * cores)
    assert step is None or step.name != "threads"


def test_the_plan_keeps_to_this_machines_memory():
    rep = fetch_bound_torch()
    steps = plan(rep, 3, 8e9)
    assert steps[0].name == "cache" and steps[0].switch_to == "coordl.DataLoader"
    assert all(s.name != "cache" for s in plan(rep, 3, 1e6))  # a cache over the budget is not run


def test_nothing_to_do_for_a_compute_bound_job_and_one_step_for_a_spinning_one():
    assert plan(compute_bound(), 3, 8e9) == []
    assert [s.code for s in plan(spinning(), 3, 8e9)] == ["torch.set_num_threads(1)"]


def test_a_forced_step_is_predicted_like_any_other():
    rep = one_worker_spinning_threads()
    step = forced_step(rep, {"num_workers": 0})
    assert step.name == "forced" and step.code == "DataLoader(..., num_workers=0)"
    assert step.predicted_samples_per_s < verdict(rep)["predicted_samples_per_s"]


def workers_that_wait() -> dict:
    """4 cores, 4 workers whose items wait (0.2 ms of CPU in each 6.7 ms): the ranked workers stop at the cores."""
    mp = {
        "torch_threads": 1,
        "threads_follow_cores": False,
        "step_device": "cpu",
        "step_cpu_s_per_batch": 0.002,
    }
    ps = {"workers": [1, 2, 3, 4], "samples_per_s": [150.0, 300.0, 450.0, 600.0], "cpu_s_per_sample": [0.0002] * 4,
          "cpu_share": [1.0] * 4, "cores": 4}  # fmt: skip
    rates = {"compute": 2000.0, "prep": 600.0, "fetch": 50000.0, "observed": 580.0}
    return at_model_rate(
        base(
            machine=_MACHINE,
            main_process=mp,
            prep_scaling=ps,
            fetch=FAST_STORAGE,
            cache_bytes=1e9,
            workers=4,
            rates_per_s=rates,
        )  # fmt: skip
    )


def test_workers_that_wait_get_more_items_in_flight_when_nothing_ranked_applies():
    rep = workers_that_wait()
    steps = plan(rep, 3, 8e9)
    # twice the workers, then nothing: a worker makes one batch at a time, a deeper queue adds no read
    assert [s.loader_args for s in steps] == [{"num_workers": 8}]
    now = verdict(rep)["predicted_samples_per_s"]
    assert steps[0].predicted_samples_per_s > 1.9 * now  # twice the reads in flight
    assert next_step(rep, Config(), 8e9, frozenset({"workers"})) is None
    assert plan(one_worker_spinning_threads(), 3, 8e9)[0].name == "workers"  # workers that compute: ranked

"""verify: the change read from the run's loader, the prediction for it, the measured rate, report.json."""

from __future__ import annotations

import json
import sys

import pytest

from dsanalyzer.cli import main as cli_main
from dsanalyzer.judge.verify import fill_epochs, verify_result, warmup_for
from dsanalyzer.measure.launch import ProfileError
from dsanalyzer.model.whatif import Model
from dsanalyzer.report.html_tables import verify_block
from dsanalyzer.report.schema import load_report, write_report
from dsanalyzer.report.text import verify_text
from tests.dsanalyzer.judge.test_verdict import base, with_real_run
from tests.dsanalyzer.workloads import write_files, write_script


def fake_run(rate: float, loader: dict, iters: int = 30, batch: int = 32) -> dict:
    step = batch / rate
    return {
        "wait_s": [0.0] * iters,
        "step_s": [step] * iters,
        "batch_items": [batch] * iters,
        "loader": loader,
    }


def test_verify_predicts_the_configuration_the_run_used():
    rep = base(prep_scaling={"workers": [1, 2], "samples_per_s": [5000.0, 9000.0]})
    loader = {"class": "coordl.dataloader.DataLoader", "num_workers": 2, "cache_bytes": 600_000_000}
    model = Model.from_report(rep)
    expected = model.predict(6e8, 2, model.storage_bytes_per_s, policy="minio", workers=2).samples_per_s
    v = verify_result(rep, fake_run(expected * 1.05, loader), warmup=5, command=["python", "t.py"])
    assert v["change"] == {"cache_bytes": 600_000_000}  # the worker count did not change
    assert v["predicted_samples_per_s"] == pytest.approx(expected)
    assert v["measured_samples_per_s"] == pytest.approx(expected * 1.05)
    assert v["error"] == pytest.approx(0.05) and v["within_target"]
    text = verify_text(v)
    assert "predicted" in text and "measured" in text and "+5.0%" in text


def test_verify_outside_the_target_says_so():
    rep = base(prep_scaling={"workers": [1, 2], "samples_per_s": [5000.0, 9000.0]})
    v = verify_result(rep, fake_run(100.0, {"num_workers": 1}), warmup=0, command=["x"])
    assert v["change"] == {"num_workers": 1} and not v["within_target"]
    assert "outside the ±10% target" in verify_text(v)


def test_verify_baseline_judges_the_prediction_on_the_machine_as_it_is_now():
    rep = with_real_run(base(prep_scaling={"workers": [1, 2], "samples_per_s": [5000.0, 9000.0]}), 1000.0)
    predicted = verify_result(rep, fake_run(1.0, {"num_workers": 2}), 0, ["x"])["predicted_samples_per_s"]
    # the profiled job itself now runs 15% slower (median of three), and the changed job 20% below the
    # prediction: 6% below it once the prediction moves with the machine
    slow = [fake_run(rate, {}) for rate in (800.0, 850.0, 900.0)]
    changed = [fake_run(predicted * 0.8, {"num_workers": 2})] * 3
    v = verify_result(rep, changed, warmup=0, command=["x"], baseline=slow)
    b = v["baseline"]
    assert v["error"] == pytest.approx(-0.2)  # against the profile's minutes, kept
    assert b["samples_per_s"] == pytest.approx(850.0) and b["drift"] == pytest.approx(0.85)
    assert b["predicted_samples_per_s"] == pytest.approx(predicted * 0.85)
    assert b["error"] == pytest.approx(0.8 / 0.85 - 1) and v["within_target"]
    assert "baseline: the profiled job ran 850.0 samples/s" in verify_text(v) and "-15.0%" in verify_text(v)
    assert "Profiled job now" in verify_block({"verify": v})
    assert "-20.0% (against the machine of the profile;" in verify_text(v)  # the raw error is not judged
    # the same runs without the baseline: outside
    assert not verify_result(rep, changed, warmup=0, command=["x"])["within_target"]
    # a machine that got faster does not excuse a prediction that was low
    fast = verify_result(rep, changed, warmup=0, command=["x"], baseline=[fake_run(1300.0, {})])
    assert fast["baseline"]["error"] == pytest.approx(0.8 / 1.3 - 1) and not fast["within_target"]


def test_verify_baseline_without_iterations_names_the_baseline():
    rep = with_real_run(base(prep_scaling={"workers": [1, 2], "samples_per_s": [5000.0, 9000.0]}), 1000.0)
    empty = {"wait_s": [], "step_s": [], "batch_items": []}
    with pytest.raises(ProfileError, match="baseline"):
        verify_result(rep, fake_run(900.0, {"num_workers": 2}), 0, ["x"], baseline=[empty])


def test_verify_compares_the_median_of_several_runs():
    rep = base(prep_scaling={"workers": [1, 2], "samples_per_s": [5000.0, 9000.0]})
    runs = [fake_run(rate, {"num_workers": 2}) for rate in (100.0, 300.0, 200.0)]
    v = verify_result(rep, runs, warmup=0, command=["x"])
    assert v["measured_samples_per_s"] == pytest.approx(200.0)
    assert v["measured_range"] == pytest.approx([100.0, 300.0])
    assert [round(r["samples_per_s"]) for r in v["runs"]] == [100, 300, 200]
    assert "median of 3 runs" in verify_text(v)


def test_verify_outside_the_target_names_a_step_that_moved():
    """The step itself slower than in the profile: the text says the machine moved, with both times."""
    rep = base(prep_scaling={"workers": [1, 2], "samples_per_s": [5000.0, 9000.0]})
    model = Model.from_report(rep)
    predicted = model.predict(0, 2, model.storage_bytes_per_s, policy=model.cache_policy, workers=2)
    slow = fake_run(0.6 * predicted.samples_per_s, {"num_workers": 2})  # 40% short, all of it step time
    step = slow["step_s"][0]
    rep["runs"]["prep"]["summary"] = {"step_s": step / 1.4}
    v = verify_result(rep, [slow, slow], warmup=0, command=["x"])
    assert not v["within_target"] and v["step_s_measured"] == pytest.approx(step)
    text = verify_text(v)
    assert (
        f"the step itself took {step * 1e3:.1f} ms here vs {step / 1.4 * 1e3:.1f} ms in the profile (+40%)"
        in text
    )
    rep["runs"]["prep"]["summary"] = {"step_s": step}  # the same step in the profile: the model missed
    assert "step itself" not in verify_text(verify_result(rep, [slow], warmup=0, command=["x"]))


def test_verify_outside_the_target_names_other_processes_on_the_cores():
    rep = base(prep_scaling={"workers": [1, 2], "samples_per_s": [5000.0, 9000.0]})
    slow = fake_run(100.0, {"num_workers": 2})
    v = verify_result(
        rep, [dict(slow, other_cpu_cores=1.9), dict(slow, other_cpu_cores=1.7)], warmup=0, command=["x"]
    )
    assert v["other_cpu_cores"] == pytest.approx(1.8)
    assert "interference: other processes used 1.80 of the 2 cores during these runs" in verify_text(v)
    quiet = verify_result(rep, [dict(slow, other_cpu_cores=0.05)], warmup=0, command=["x"])
    assert "interference" not in verify_text(quiet)
    unknown = verify_result(rep, [slow], warmup=0, command=["x"])  # not monitored: nothing claimed
    assert unknown["other_cpu_cores"] is None and "interference" not in verify_text(unknown)


def test_verify_outside_the_target_names_a_profile_measured_on_a_busy_machine():
    rep = base(prep_scaling={"workers": [1, 2], "samples_per_s": [5000.0, 9000.0]})
    samples = {"prep_scaling": [1.2, 1.4], "compute": [0.0], "prep": [0.1, 0.1], "real": [0.0]}
    rep["sysmon"] = {
        "other_cpu_cores": [v for run in samples.values() for v in run],
        "runs": [{"run": run, "samples": len(v)} for run, v in samples.items()],
    }
    fast = dict(fake_run(20_000.0, {"num_workers": 2}), other_cpu_cores=0.02)
    v = verify_result(rep, [fast], warmup=0, command=["x"])
    assert v["other_cpu_cores_profile"] == pytest.approx(1.3)  # the busier of the two prep runs
    assert (
        "interference during the profile: other processes used 1.30 of the 2 cores while it measured prep"
        in verify_text(v)
    )


@pytest.mark.parametrize(
    ("items", "iters", "batch", "epochs"),
    [
        (1472, 46, 32, 1),  # every epoch reads every item: the first fills the cache
        (1500, 46, 32, 2),  # the demo: 28 items left out per epoch, ~0.5 never read after two
        (1_281_167, 5004, 256, 2),  # ImageNet-1k in batches of 256, drop_last
        (40, 1, 32, 3),  # a fifth of the items left out each epoch
        (33, 1, 32, 1),  # one left out: a different one next epoch; ln 33 / ln 33 = 1
        (10, 0, 32, 1),  # fewer items than a batch: no whole epoch to count
    ],
)
def test_verify_warms_up_until_a_shuffled_drop_last_job_read_every_item(items, iters, batch, epochs):
    assert fill_epochs(items, iters, batch) == epochs
    loader = {"drop_last": True, "batches_per_epoch": iters}
    rep = {"loader": loader, "dataset": {"items": items}, "batch_size": batch, "warmup_iters": 5}
    assert warmup_for(rep) == epochs * iters + 5
    rep["loader"] = {**loader, "drop_last": False}  # a partial last batch: every item every epoch
    assert warmup_for(rep) == iters + 5


def test_verify_names_pauses_of_the_training_process_and_the_rate_without_them():
    """A step that took 40x its median: the process paused; the note gives the rate without it."""
    rep = base(prep_scaling={"workers": [1, 2], "samples_per_s": [5000.0, 9000.0]})
    run = fake_run(500.0, {"num_workers": 2}, iters=100)  # 64 ms steps, no wait
    step = run["step_s"][0]
    jittery = dict(run, step_s=[step * 1.5 if i % 10 == 0 else step for i in range(100)])  # not pauses
    paused = dict(run, step_s=[step * 40 if i == 50 else step for i in range(100)])
    v = verify_result(rep, [paused, paused, jittery], warmup=0, command=["x"])
    first = v["runs"][0]
    assert first["pauses"] == 1 and first["pause_s"] == pytest.approx(39 * step)
    assert first["pause_share"] == pytest.approx(39 / 139) and first["longest_step_s"] == pytest.approx(
        40 * step
    )
    assert first["samples_per_s_without_pauses"] == pytest.approx(500.0)
    assert v["runs"][2]["pauses"] == 0 and v["measured_without_pauses_samples_per_s"] == pytest.approx(500.0)
    text = verify_text(v)
    assert not v["within_target"]
    assert "the training process itself paused outside the loader in 2 of 3 runs" in text
    assert "(run 1: 1 step of up to 2,560 ms against a median of 64.0 ms, 28% of its time)" in text
    clean_error = 500.0 / v["predicted_samples_per_s"] - 1
    assert f"without the pauses the median is 500.0 samples/s ({clean_error:+.1%})" in text
    assert v["note"] in text and "Measured causes" in verify_block({"verify": v})  # JSON and HTML too
    calm = verify_result(rep, [jittery], warmup=0, command=["x"])
    assert calm["runs"][0]["pauses"] == 0 and "paused" not in verify_text(calm)
    assert calm["note"] == "" and "Measured causes" not in verify_block({"verify": calm})


def test_verify_keeps_every_key_of_the_report(tmp_path):
    rep = with_real_run(base(prep_scaling={"workers": [1, 2], "samples_per_s": [5000.0, 9000.0]}), 300.0)
    rep["schema_version"] = 2
    write_report(rep, tmp_path)
    before = set(json.loads((tmp_path / "report.json").read_text()))
    rep["verify"] = verify_result(rep, fake_run(300.0, {"num_workers": 2}), 0, ["x"])
    write_report(rep, tmp_path)
    after = load_report(tmp_path / "report.json")
    assert before | {"verify"} == set(after)
    assert 'id="verify"' in (tmp_path / "report.html").read_text()


@pytest.mark.slow
def test_cli_verify_runs_the_changed_job(tmp_path, capsys):
    data = write_files(tmp_path / "data", n=48, size=8192)
    out = tmp_path / "run"
    common = ["--quiet", "--iters", "10", "--warmup", "2"]
    rc = cli_main(
        [
            "profile",
            *common,
            "--out",
            str(out),
            "--",
            sys.executable,
            str(write_script(tmp_path / "t1.py", workers=1)),
            str(data),
        ]
    )
    assert rc == 0
    changed = write_script(tmp_path / "t2.py", workers=2)
    rc = cli_main(
        ["verify", str(out / "report.json"), *common, "--", sys.executable, str(changed), str(data)]
    )
    printed = capsys.readouterr().out
    assert rc == 0 and "verify (num_workers=2)" in printed
    v = load_report(out / "report.json")["verify"]
    assert v["change"] == {"num_workers": 2} and v["measured_samples_per_s"] > 0 and v["warmup_iters"] == 2
    assert v["other_cpu_cores"] is None or 0 <= v["other_cpu_cores"] <= v["cpus"] + 0.5  # the monitor ran


@pytest.mark.slow
def test_cli_verify_baseline_runs_the_profiled_job_beside_the_changed_one(tmp_path, capsys):
    data = write_files(tmp_path / "data", n=48, size=8192)
    out = tmp_path / "run"
    common = ["--quiet", "--iters", "10", "--warmup", "2"]
    profiled = write_script(tmp_path / "t1.py", workers=1)
    assert (
        cli_main(["profile", *common, "--out", str(out), "--", sys.executable, str(profiled), str(data)]) == 0
    )
    changed = write_script(tmp_path / "t2.py", workers=2)
    argv = ["verify", str(out / "report.json"), *common, "--runs", "2", "--baseline"]
    assert cli_main([*argv, "--", sys.executable, str(changed), str(data)]) == 0
    assert "baseline: the profiled job ran" in capsys.readouterr().out
    v = load_report(out / "report.json")["verify"]
    assert len(v["baseline"]["runs_samples_per_s"]) == 2 and v["baseline"]["samples_per_s"] > 0
    assert sorted(p.name for p in (out / "logs").glob("baseline*.log")) == ["baseline-2.log", "baseline.log"]
    assert list((out / "logs" / "baseline").glob("result-*.json"))  # the profiled job's own result


def test_verify_splits_a_remote_run_between_its_actors_and_its_workers():
    rep = with_real_run(base(prep_scaling={"workers": [1, 2], "samples_per_s": [5000.0, 9000.0]}), 1000.0)
    rep["loader"] = {**(rep.get("loader") or {}), "remote_wire_bytes": 150528.0}
    run = fake_run(1200.0, {"num_workers": 1, "remote_cpus": 1, "remote_wire_bytes": 150528.0}, iters=10)
    run["loader_counters"] = {"remote_items": 6 * 32 * 0.5}  # half of the 6 measured batches (4 warm up)
    v = verify_result(rep, [run], warmup=4, command=["x"])
    split = v["remote_split"]
    assert v["change"]["remote_cpus"] == 1
    assert split["remote_share"] == pytest.approx(0.5)
    assert split["measured_remote_samples_per_s"] == pytest.approx(600.0)
    assert split["predicted_remote_samples_per_s"] > 0 and split["predicted_local_samples_per_s"] >= 0
    assert "remote CPUs: 600.0 samples/s (predicted" in verify_text(v)
    del run["loader_counters"]  # an older hook: no split, nothing claimed
    assert verify_result(rep, [run], warmup=4, command=["x"])["remote_split"] is None

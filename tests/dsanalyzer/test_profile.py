"""The Python API ``dsanalyzer.profile`` and the ``dsanalyzer profile`` command end to end."""

from __future__ import annotations

import sys

import pytest
from torch.utils.data import DataLoader

import dsanalyzer
from dsanalyzer.cli import main as cli_main
from dsanalyzer.model.whatif import Model
from dsanalyzer.report.schema import load_report
from tests.dsanalyzer.workloads import TimedSource, sleep_step, write_files, write_script


def test_api_profile_returns_a_valid_report(tmp_path):
    source = TimedSource(items=64, item_bytes=1000, fetch_s=0.001, prep_s=0.0)

    def make_loader():  # the same dataset object for every run, as users often write it
        return DataLoader(source, batch_size=4, num_workers=1)

    fetches_before = source.counters.snapshot()["fetch_n"]
    report = dsanalyzer.profile(
        make_loader, sleep_step(0.002), iters=8, warmup=2, out=tmp_path, workers_list=[1]
    )
    loaded = load_report(tmp_path / "report.json")
    assert loaded["batch_size"] == 4 and loaded["workers"] == 1
    assert set(loaded["runs"]) == {"prep_scaling", "compute", "prep", "real"}
    assert loaded["prep_scaling"]["workers"] == [1]
    assert loaded["rates_per_s"]["compute"] > 0 and loaded["rates_per_s"]["observed"] > 0
    assert loaded["dataset"]["avg_item_bytes"] == 1000
    assert loaded["sysmon"]["t_s"] and len(loaded["sysmon"]["cpu_percent_per_core"][0]) >= 1
    assert report["bound"] in ("compute", "prep", "fetch")
    # the memory-served fetch of the prep runs was undone: the real run read through fetch()
    assert "fetch" not in vars(source)
    assert source.counters.snapshot()["fetch_n"] > fetches_before
    assert (tmp_path / "report.html").is_file()
    # per-sample prep times of the item source: every item but the untimed first (64 items, 64 asked)
    spread = loaded["prep_spread"]
    assert spread["n"] == 63 == len(spread["cpu_s"]) and spread["p50_s"] <= spread["p99_s"] <= spread["max_s"]
    assert set(spread) >= {"n", "p50_s", "p90_s", "p99_s", "max_s", "p99_over_p50"}
    assert loaded["verdict"]["skew"]["workers"] == 1 and loaded["verdict"]["skew"]["loss"] == 0.0


def test_api_profile_measures_what_starting_each_epoch_costs(tmp_path):
    # torch's DataLoader with a non-persistent worker: every epoch forks a new one, which must make its
    # first batch (4 items of 1 ms each) from nothing before the loop gets it.
    source = TimedSource(items=16, item_bytes=1000, fetch_s=0.001, prep_s=0.0)
    report = dsanalyzer.profile(
        lambda: DataLoader(source, batch_size=4, num_workers=1), sleep_step(0.002), iters=10, warmup=2,
        out=tmp_path, workers_list=[1],
    )  # fmt: skip
    start = report["epoch_start"]
    assert start["epochs"] >= 2  # 4 batches an epoch: the real run began epochs at batches 4 and 8
    assert start["first_wait_s"] >= 0.004
    assert report["model"]["epoch_start_s"] == pytest.approx(start["s_per_epoch"])
    if start["s_per_epoch"] > 0:  # charged once an epoch: below the rate between starts
        prediction = Model.from_report(report).predict_measured()
        assert prediction.samples_per_s < prediction.steady
        assert report["verdict"]["predicted_samples_per_s"] == pytest.approx(prediction.samples_per_s)


def test_api_profile_of_an_empty_loader_is_a_clear_error():
    with pytest.raises(RuntimeError, match="yielded no batches"):
        dsanalyzer.profile(lambda: DataLoader([], batch_size=2), sleep_step(0.0), iters=2, warmup=0)


@pytest.mark.slow
def test_cli_profile_of_an_unmodified_script_then_whatif(tmp_path, capsys):
    data = write_files(tmp_path / "data", n=48, size=8192)
    script = write_script(tmp_path / "train.py", workers=1)
    out = tmp_path / "run"
    rc = cli_main(
        [
            "profile",
            "--quiet",
            "--iters",
            "12",
            "--warmup",
            "2",
            "--out",
            str(out),
            "--",
            sys.executable,
            str(script),
            str(data),
        ]
    )
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "per iteration: compute" in printed and "bound:" in printed
    report = load_report(out / "report.json")
    assert report["dataset"]["items"] == 48 and report["dataset"]["path"] == str(data)
    assert report["fetch"]["bytes_per_s"] > 0
    assert report["real_cold"]["evicted"] == 48
    assert report["whatif"]["grid"], report["model"]
    assert (out / "report.html").stat().st_size > 10_000
    # what decides the cores torch's idle threads hold on more cores: the host's spin and the preemptions
    assert report["main_process"]["job_main_preempts_per_batch"] >= 0
    spin = report["machine"]["omp_spin"]
    assert spin["spin_s"] is None or 0 < report["machine"]["omp_spin_s"] < spin["gap_s"], spin
    rc = cli_main(["whatif", str(out / "report.json"), "--cache-gb", "1", "--cpus", "4"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert rc == 0 and last.startswith("predicted_samples_per_s=")


def test_prep_scaling_skips_worker_counts_the_loader_cannot_run():
    from dsanalyzer.measure.runs import measure_prep_scaling

    class FixedWorkers:
        batch_size = 2
        num_workers = 1

        def open(self):
            if self.num_workers != 1:
                raise IndexError("per-worker table sized for 1 worker")
            return iter([[0, 1]] * 50)

    loader = FixedWorkers()
    out = measure_prep_scaling(loader, loader.open, [1, 2], iters=5, warmup=1)
    assert out["workers"] == [1] and len(out["samples_per_s"]) == 1
    assert "per-worker table" in out["skipped"]["2"]
    assert loader.num_workers == 1  # restored

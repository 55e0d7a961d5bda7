"""Every dsanalyzer sub-command with bad arguments: one line naming the argument, non-zero exit, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dsanalyzer.cli", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["profile", "--iters", "0", "--", "python", "x.py"], "--iters"),
        (["profile", "--warmup", "-1", "--", "python", "x.py"], "--warmup"),
        (["profile", "--timeout", "soon", "--", "python", "x.py"], "--timeout"),
        (["profile"], "--"),
        (["whatif"], "report"),
        (["whatif", "missing.json"], "missing.json"),
        (["whatif", "REPORT", "--cpus", "many"], "--cpus"),
        (["verify", "REPORT", "--iters", "abc", "--", "python", "x.py"], "--iters"),
        (["verify", "missing.json", "--", "python", "x.py"], "missing.json"),
        (["verify", "REPORT"], "--"),
        (["fix"], "--"),
        (["fix", "--rounds", "0", "--", "python", "x.py"], "--rounds"),
        (["fix", "--report", "missing.json", "--", "python", "x.py"], "missing.json"),
        (["fix", "--force-step", "{not json", "--", "python", "x.py"], "--force-step"),
        (["demo", "--items", "-5"], "--items"),
        (["demo", "--storage-mbps", "0"], "--storage-mbps"),
        (["nonsense"], "nonsense"),
    ],
)
def test_bad_arguments_give_one_line(tmp_path, args, named):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"schema_version": 2}))
    proc = run_cli(*[str(report) if a == "REPORT" else a for a in args], cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0
    assert len(lines) == 1, proc.stderr
    assert named in lines[0] and "Traceback" not in proc.stderr


def test_help_is_plain_text():
    for args in (["--help"], ["whatif", "--help"], ["verify", "--help"], ["fix", "--help"]):
        proc = run_cli(*args)
        assert proc.returncode == 0 and "``" not in proc.stdout


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--jobs", "0"], "--jobs must be >= 1"),
        (["--jobs", "two"], "--jobs"),
        (
            ["--jobs", "2"],
            "--jobs: coordinated prep was not measured in this report: the report has no remedy_probes",
        ),
        (["--sample-cache-gb", "-1"], "--sample-cache-gb must be a number >= 0"),
        (["--sample-cache-gb", "nan"], "--sample-cache-gb must be a number >= 0"),
        (["--sample-cache-gb", "2"], "--sample-cache-gb: the sample cache was not measured"),
        (["--jobs", "2", "--sample-cache-gb", "2"], "give one of them"),
    ],
)
def test_whatif_remedy_options_name_what_is_wrong(tmp_path, args, named):
    """--jobs / --sample-cache-gb on a report from before the probes (or with a bad value): one line saying why."""
    from tests.dsanalyzer.model.test_whatif import synthetic_report

    report = tmp_path / "report.json"
    report.write_text(json.dumps(synthetic_report()))
    proc = run_cli("whatif", str(report), *args, cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert named in lines[0] and "Traceback" not in proc.stderr


def test_whatif_remedy_options_print_a_prediction(tmp_path):
    from tests.dsanalyzer.model.test_sample_cache import report as cache_report

    rep = cache_report()
    rep["remedy_probes"]["coordinate"] = {"batch_bytes": 400_000, "receive_cpu_s_per_batch": 0.0005}
    report = tmp_path / "report.json"
    report.write_text(json.dumps(rep))
    for args, says in ((["--jobs", "3"], "together"), (["--sample-cache-gb", "2"], "with the sample cache")):
        proc = run_cli("whatif", str(report), *args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert says in proc.stdout
        assert float(proc.stdout.strip().splitlines()[-1].split("=")[1]) > 0

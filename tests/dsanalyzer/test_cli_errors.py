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
    for args in (["--help"], ["whatif", "--help"], ["verify", "--help"]):
        proc = run_cli(*args)
        assert proc.returncode == 0 and "``" not in proc.stdout

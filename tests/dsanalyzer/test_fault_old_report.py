"""Fault: ``report.json`` written by an older (or newer) dsanalyzer is given to today's commands.

Promise: the command exits non-zero with one clear line that names the file, the version it found
and the version it reads, and how to get a current report; no traceback, no KeyError from deep inside.
Run as real processes through both entry points (``dsanalyzer whatif`` and the stand-alone module).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# What an early dsanalyzer wrote: other field names, version 0.
_V0 = {
    "schema_version": 0,
    "cmd": "python train.py",
    "rates": {"compute": 640.0, "prep": 400.0, "fetch": 300.0},
    "stalls": {"prep": 0.03, "fetch": 0.03},
}


def _cli(module: str, *args: str) -> subprocess.CompletedProcess:
    prefix = ["whatif"] if module == "dsanalyzer.cli" else []
    return subprocess.run(
        [sys.executable, "-m", module, *prefix, *args],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


@pytest.mark.timeout(120)
@pytest.mark.parametrize("module", ["dsanalyzer.cli", "dsanalyzer.whatif_cli"])
@pytest.mark.parametrize(
    "content, found",
    [
        (_V0, "0"),
        ({**_V0, "schema_version": 99}, "99"),  # from a newer dsanalyzer
        ({k: v for k, v in _V0.items() if k != "schema_version"}, "None"),  # before versions existed
    ],
    ids=["older", "newer", "unversioned"],
)
def test_old_report_gets_a_clear_message(tmp_path: Path, module: str, content: dict, found: str) -> None:
    path = tmp_path / "run1" / "report.json"
    path.parent.mkdir()
    path.write_text(json.dumps(content))
    done = _cli(module, str(path), "--cache-gb", "1")
    assert done.returncode != 0
    err = done.stderr
    assert "Traceback" not in err and "KeyError" not in err, err
    assert str(path) in err and "schema_version" in err and found in err and "1" in err, err
    assert done.stdout.strip() == ""  # no half a table printed before the error


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "text", ['{"schema_version": 1, "rates_per', "", "[1, 2]"], ids=["torn", "empty", "list"]
)
def test_unreadable_report_gets_a_clear_message(tmp_path: Path, text: str) -> None:
    path = tmp_path / "report.json"
    path.write_text(text)
    done = _cli("dsanalyzer.cli", str(path))
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and str(path) in done.stderr, done.stderr

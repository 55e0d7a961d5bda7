"""``gradcomp train`` end to end as a world of one: the report carries data wait, compute and comm per iteration."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra", [["--compressor", "mstopk", "--plan", "always"], ["--baseline", "torch-fp16"]]
)
def test_train_writes_per_iteration_data_compute_and_comm(tmp_path: Path, extra: list[str]) -> None:
    report = tmp_path / "r.json"
    argv = [sys.executable, "-m", "gradcomp.cli", "train", "--data", "tensors", "--samples", "64",
            "--batch-size", "8", "--iters", "4", "--warmup-report", "1", "--report", str(report), *extra]  # fmt: skip
    res = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads(report.read_text())
    rows = data["iterations"]
    assert len(rows) == 4
    for key in ("data_wait_s", "compute_s", "comm_s", "comm_exposed_s", "step_s", "loss", "acc"):
        assert all(key in r and r[key] >= 0 for r in rows), key
    assert all(r["buckets"] >= 1 for r in rows)
    assert "data wait" in res.stdout

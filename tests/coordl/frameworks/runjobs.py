"""Running the 2-rank framework jobs from the tests, and what their rank files say."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from .jobdata import read_ranks

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
TIMEOUT_S = 240


def run_job(launcher: list[str], script: str, out: Path, *args: str) -> list[dict[str, Any]]:
    """Run ``script`` with ``launcher`` (2 CPU ranks) writing into ``out``; the ranks' records."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [*launcher, str(HERE / script), "--out", str(out), *args]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return read_ranks(str(out))


def lightning(out: Path, *args: str) -> list[dict[str, Any]]:
    return run_job([sys.executable], "lightning_job.py", out, *args)


def accelerate(out: Path, *args: str) -> list[dict[str, Any]]:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    return run_job(torchrun, "accelerate_job.py", out, *args)


def items(rank: dict[str, Any], epoch: int) -> list[int]:
    return rank["seen"][str(epoch)]


def assert_sharded(ranks: list[dict[str, Any]], num_items: int, epochs: int) -> None:
    """Every epoch: disjoint per-rank item sets that together cover the dataset."""
    for epoch in range(epochs):
        a, b = (set(items(r, epoch)) for r in ranks)
        assert len(items(ranks[0], epoch)) == len(a) == num_items // 2 == len(b)
        assert not a & b and a | b == set(range(num_items)), f"epoch {epoch}: not sharded"

"""Running the 2-rank framework jobs from the tests, and what their rank files say."""

from __future__ import annotations

import os
import signal
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
    # faulthandler in every process of the job (ranks and loader workers): a hang is reported with stacks.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    cmd = [*launcher, str(HERE / script), "--out", str(out), *args]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stdout, stderr = _stacks_of_hung(proc)
        raise AssertionError(
            f"{' '.join(cmd)} hung for {TIMEOUT_S} s; every process's threads (faulthandler, SIGABRT):\n"
            f"{stdout[-3000:]}\n{stderr[-30000:]}"
        ) from None
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{stdout[-3000:]}\n{stderr[-6000:]}"
    return read_ranks(str(out))


def _stacks_of_hung(proc: subprocess.Popen) -> tuple[str, str]:
    """SIGABRT to the job's process group (faulthandler prints each process's stacks), then SIGKILL."""
    for sig, wait_s in ((signal.SIGABRT, 30), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            return proc.communicate(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
    return "", "(no output: a process outside the job's group holds its pipes)"


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

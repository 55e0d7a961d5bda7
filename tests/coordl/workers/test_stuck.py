"""A forked loader worker stuck inside ``os.fork()`` (CPython gh-112275) is replaced, not waited for forever.

Each test runs ``stuck_job.py``, a plain torch script, in its own process (its ``os.register_at_fork``
handler makes chosen children hang inside the fork, as a child that inherited CPython's thread-list lock
does), and checks the epochs against torch's own loader over the same seed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

JOB = Path(__file__).with_name("stuck_job.py")
ROOT = Path(__file__).resolve().parents[3]


def run(tmp_path: Path, stuck: int, *args: str, timeout: float = 120) -> tuple[list[dict], str]:
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    for n in range(stuck):
        (tokens / f"{n:03d}").touch()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(JOB), str(tokens), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    epochs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return epochs, proc.stderr


def assert_gone(pids: list[int]) -> None:
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid


def test_a_worker_stuck_in_fork_is_replaced_and_the_epoch_is_torchs(tmp_path: Path) -> None:
    epochs, stderr = run(tmp_path, 1)
    assert [e["same"] for e in epochs] == [True, True]
    assert len(epochs[0]["stuck"]) == 1
    assert stderr.count("was stuck inside os.fork()") == 1 and "gh-112275" in stderr
    assert_gone(epochs[0]["stuck"])


def test_every_worker_of_an_epoch_stuck_with_persistent_workers(tmp_path: Path) -> None:
    # both workers of the first epoch stuck; the second epoch reuses the replacements without waiting
    epochs, stderr = run(tmp_path, 2, "--persistent", "--epochs", "3", "--stuck-after", "0.5")
    assert [e["same"] for e in epochs] == [True, True, True]
    assert stderr.count("was stuck inside os.fork()") == 2
    assert max(e["seconds"] for e in epochs[1:]) < epochs[0]["seconds"]
    assert_gone(epochs[0]["stuck"])


def test_the_users_fork_context_is_given_back(tmp_path: Path) -> None:
    epochs, stderr = run(tmp_path, 1, "--fork-context", "--stuck-after", "0.5")
    assert [(e["same"], e["context_kept"]) for e in epochs] == [(True, True), (True, True)]
    assert stderr.count("was stuck inside os.fork()") == 1


def test_a_worker_that_stays_stuck_fails_the_epoch_after_three_replacements(tmp_path: Path) -> None:
    # one worker, and its first four forks all stuck: the original and three replacements; the fourth is
    # killed, and the epoch fails as torch's does when a worker dies, with the reason logged
    epochs, stderr = run(tmp_path, 4, "--workers", "1", "--stuck-after", "0.5")
    assert [(e["epoch"], e["error"]) for e in epochs] == [(0, "WorkerDiedError")]
    assert re.search(
        r"DataLoader worker \(pids?\(?s?\)? [\d, ]+\)( is killed by signal: | exited unexpectedly)",
        epochs[0]["message"],
    )
    assert stderr.count("started pid") == 3
    assert "and so were 3 processes started in its place; killing it" in stderr
    stuck = [int(x) for x in (tmp_path / "stuck.log").read_text().split()]
    assert len(stuck) == 4
    assert_gone(stuck)


def test_with_the_programs_own_context_a_stuck_worker_fails_the_epoch(tmp_path: Path) -> None:
    # its processes are made by the program's context class: none can be started in the stuck one's place
    epochs, stderr = run(tmp_path, 1, "--custom-context", "--workers", "1", "--stuck-after", "0.5")
    assert [(e["epoch"], e["error"]) for e in epochs] == [(0, "WorkerDiedError")]
    assert "cannot be replaced (the loader's multiprocessing_context is the program's own)" in stderr
    assert "Traceback" not in stderr


def test_a_worker_that_dies_at_its_start_is_left_to_torch(tmp_path: Path) -> None:
    # killed inside the fork: not stuck, gone; the watch stops following it, torch reports the death
    epochs, stderr = run(tmp_path, 1, "--die", "--stuck-after", "0.5")
    assert len(epochs) == 1 and epochs[0]["watching"] is False
    # torch's SIGCHLD handler reports the death wherever the main process is: in iter(), in a sleep, or in next()
    assert set(epochs[0]["reported"]) <= {"iter", "sleep", "next"} and epochs[0]["reported"], epochs
    assert "was stuck" not in stderr


def test_a_slow_start_that_uses_cpu_is_not_taken_for_stuck(tmp_path: Path) -> None:
    # every child spends 1.5 s of CPU inside the fork: slower than the 0.5 s limit, but it makes progress
    epochs, stderr = run(tmp_path, 0, "--busy", "1.5", "--stuck-after", "0.5", "--workers", "1")
    assert [e["same"] for e in epochs] == [True, True]
    assert "was stuck" not in stderr


@pytest.mark.parametrize("persistent", [False, True])
def test_no_worker_stuck_no_message(tmp_path: Path, persistent: bool) -> None:
    epochs, stderr = run(tmp_path, 0, *(["--persistent"] if persistent else []))
    assert [e["same"] for e in epochs] == [True, True]
    assert "was stuck" not in stderr


@pytest.mark.slow
def test_the_real_fork_race_never_hangs_an_epoch(tmp_path: Path) -> None:
    # 300 epochs, 600 forks, beside native threads entering Python: on CPython 3.11.7 torch's own loader
    # hung 2 epochs of 300 in this job (reports/bench_loader.md); coordl's must run every epoch, in torch's order.
    # Why this test is long (30-80 s of CI's parallel phase): at that rate 300 epochs show a loader that hangs
    # like torch's in 87% of runs, 100 epochs in under half of them.
    proc = subprocess.run(
        [sys.executable, str(JOB.with_name("fork_race_job.py")), "--loader", "coordl", "--epochs", "300"],
        capture_output=True, text=True, timeout=400, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert (result["epochs"], result["wrong"], result["timeouts"]) == (300, 0, 0), result

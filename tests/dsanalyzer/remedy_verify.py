"""What the remedies' slow tests share: profile :mod:`tests.dsanalyzer.remedy_job`, ask ``whatif``, run the remedy.

Each step goes through the real command line (``dsanalyzer profile``, ``dsanalyzer whatif``) and the job
runs as separate processes, as a user's would. The numbers are printed (run pytest with ``-s`` to see
them) and appended to ``$COORDL_REMEDY_LOG`` when it is set, for docs/whatif.md's validation tables.

The machine may be shared: a profile taken while other processes held cores predicts for that machine,
and a run while they held more or fewer moves by the difference, whatever the model. :func:`verified`
measures the other processes' cores during both (the profile's system monitor; one around the run) and
repeats an attempt that missed only when they were busy in one of them (DS-Analyzer's rule: rerun
before believing it); a miss on a quiet machine fails at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from dsanalyzer.cli import main as cli_main
from dsanalyzer.measure.sysmon import SysMonitor
from dsanalyzer.model.measured import other_cpu_cores
from dsanalyzer.report.schema import load_report

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("remedy_job.py")
TOLERANCE = 0.10
BUSY_CORES = 0.1  # other processes' mean cores (5% of this 2-core VM) above which a miss is interference


def job_command(data: Path, *args: str) -> list[str]:
    return [sys.executable, str(JOB), str(data), *args]


def make_data(root: Path, items: int = 512) -> Path:
    sys.path.insert(0, str(JOB.parent))
    try:
        from remedy_job import write_data  # the script's own helper (a script, not a package module)
    finally:
        sys.path.remove(str(JOB.parent))
    return Path(write_data(str(root), items))


def profile(out: Path, command: list[str]) -> dict:
    rc = cli_main(["profile", "--quiet", "--iters", "60", "--warmup", "5", "--min-seconds", "4",
                   "--out", str(out), "--", *command])  # fmt: skip
    assert rc == 0
    return load_report(out / "report.json")


def whatif(report: Path, *args: str, capsys) -> float:
    """``dsanalyzer whatif REPORT ARGS``'s last line, ``predicted_samples_per_s=<float>``."""
    capsys.readouterr()
    assert cli_main(["whatif", str(report), *args]) == 0
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]
    assert last.startswith("predicted_samples_per_s="), out
    print(out[-1500:])
    return float(last.split("=", 1)[1])


def profile_other_cores(report: dict) -> float:
    """Mean cores other processes used while the profile measured prep (its prep-scaling run)."""
    return other_cpu_cores(report, "prep_scaling") or 0.0


def run_jobs(
    commands: list[list[str]], sync_dir: Path | None = None, timeout_s: float = 240
) -> tuple[list[float], float]:
    """Start every command at once; each prints ``samples_per_s=``; then (coordinated) tell them to stop.
    Returns the rates and the mean cores other processes used meanwhile."""
    with SysMonitor(0.5) as mon:
        rates = _run(commands, sync_dir, timeout_s)
    values = [v for v in mon.series().get("other_cpu_cores") or [] if isinstance(v, (int, float))]
    return rates, (sum(values) / len(values) if values else 0.0)


def _run(commands: list[list[str]], sync_dir: Path | None, timeout_s: float) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, text=True, env=env) for c in commands]
    rates = []
    try:
        for p in procs:
            assert p.stdout is not None
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                line = p.stdout.readline()
                if not line:
                    break
                if line.startswith("samples_per_s="):
                    rates.append(float(line.split("=", 1)[1]))
                    break
        if sync_dir is not None:
            (sync_dir / "stop").touch()
        for p in procs:
            p.wait(timeout=60)
            assert p.returncode == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert len(rates) == len(commands)
    return rates


def record(remedy: str, predicted: float, measured: float, **extra: object) -> float:
    """Print (and log, with $COORDL_REMEDY_LOG) one verification; its error."""
    error = measured / predicted - 1
    extra.pop("error", None)
    row = {"remedy": remedy, "predicted": round(predicted, 1), "measured": round(measured, 1),
           "error": round(error, 4), "when": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), **extra}  # fmt: skip
    print("remedy verification:", json.dumps(row))
    log = os.environ.get("COORDL_REMEDY_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps(row) + "\n")
    return error


def verified(remedy: str, attempt: Callable[[Path], dict], tmp: Path, attempts: int = 3) -> dict:
    """Run ``attempt(dir)`` (it returns predicted, measured, profile_other, run_other and what to log) until
    it is within the tolerance; repeat only a miss measured beside busy other processes."""
    rows = []
    for i in range(attempts):
        row = attempt(tmp / f"attempt{i}")
        row["error"] = record(remedy, **row)
        rows.append(row)
        busy = max(row["profile_other"], row["run_other"]) > BUSY_CORES
        if abs(row["error"]) <= TOLERANCE or not busy:
            break
    last = rows[-1]
    assert abs(last["error"]) <= TOLERANCE, (
        f"{remedy}: predicted {last['predicted']:.1f}, measured {last['measured']:.1f} samples/s "
        f"({last['error']:+.1%}); other processes' cores, profile/run, per attempt: "
        + ", ".join(f"{r['profile_other']:.2f}/{r['run_other']:.2f}" for r in rows)
    )
    return last

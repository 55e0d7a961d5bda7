"""``dsanalyzer verify REPORT -- <command>``: run the changed job, then judge it against the prediction.

The run half of verify (this module) starts the changed job under the import hook from a cold cache,
``runs`` times, with the machine sampled beside it; the judging half
(:func:`dsanalyzer.judge.verify.verify_result`) sets the measured rate beside the model's prediction
and names what moved when the error is outside the target. ``report.json`` gains ``verify``.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from dsanalyzer.judge.verify import verify_result, warmup_for
from dsanalyzer.measure.hookconfig import HookConfig
from dsanalyzer.measure.launch import ProfileError, ProgressBar, run_child
from dsanalyzer.measure.sysmon import SysMonitor
from dsanalyzer.report.schema import load_report, write_report

__all__ = ["verify_command"]


def verify_command(
    report_path: str | os.PathLike,
    command: list[str],
    iters: int = 60,
    warmup: int | None = None,
    timeout_s: float = 600.0,
    show_progress: bool = True,
    runs: int = 1,
    min_seconds: float = 0.0,
) -> dict:
    """Run ``command`` (the changed job) ``runs`` times from a cold cache; add ``verify`` to the report."""
    if not command:
        raise ProfileError("verify: give the changed training command after `--`")
    if runs < 1:
        raise ProfileError(f"verify: runs must be >= 1, got {runs}")
    report = load_report(report_path)
    out = Path(report_path)
    out = out if out.is_dir() else out.parent
    warm = warmup_for(report) if warmup is None else warmup
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    results = []
    for i in range(runs):
        name = "verify" if i == 0 else f"verify-{i + 1}"
        cfg = HookConfig("real", iters, warm, result_dir=str(logs / name), min_seconds=min_seconds)
        bar = ProgressBar("      verify" if runs == 1 else f"  verify {i + 1}/{runs}", show_progress)
        with SysMonitor() as mon:
            try:
                results.append(run_child(command, cfg, logs / f"{name}.log", timeout_s, bar.update))
            finally:
                bar.close()
        others = [v for v in mon.series()["other_cpu_cores"] if v is not None]
        results[-1]["other_cpu_cores"] = statistics.mean(others) if others else None
    report["verify"] = verify_result(report, results, warm, command)
    write_report(report, out)
    return report["verify"]

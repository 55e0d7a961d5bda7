"""``dsanalyzer verify REPORT -- <command>``: run the changed job, then judge it against the prediction.

The run half of verify (this module) starts the changed job under the import hook from a cold cache,
``runs`` times, with the machine sampled beside it; the judging half
(:func:`dsanalyzer.judge.verify.verify_result`) sets the measured rate beside the model's prediction
and names what moved when the error is outside the target. ``report.json`` gains ``verify``.

``baseline=True`` runs the profiled command itself before each changed run, measured as the profile
measured it: how far the machine moved since the profile, in the same minutes as the changed runs
(:func:`dsanalyzer.judge.verify.rebased`). On the shared 2-core VM the same remote-prep job measured
1,035 and 1,127 samples/s half an hour apart; a prediction cannot know which half hour it is judged in.
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

__all__ = ["verify_command", "run_once"]


def verify_command(
    report_path: str | os.PathLike,
    command: list[str],
    iters: int = 60,
    warmup: int | None = None,
    timeout_s: float = 600.0,
    show_progress: bool = True,
    runs: int = 1,
    min_seconds: float = 0.0,
    baseline: bool = False,
) -> dict:
    """Run ``command`` (the changed job) ``runs`` times from a cold cache; add ``verify`` to the report.
    ``baseline``: also the profiled command before each run (the module docstring)."""
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
    profiled = [str(a) for a in report.get("command") or []]
    if baseline and not profiled:
        raise ProfileError(f"verify --baseline: {report_path} records no profiled command")
    # the baseline is measured as the profile's real run was: its warm-up, its iterations
    base_warm = int(report.get("warmup_iters") or 5)
    base_iters = max(1, int(((report.get("runs") or {}).get("real") or {}).get("iters") or iters) - base_warm)
    results, before = [], []
    for i in range(runs):
        name = "" if i == 0 else f"-{i + 1}"
        label = "" if runs == 1 else f" {i + 1}/{runs}"
        if baseline:
            cfg = HookConfig("real", base_iters, base_warm, result_dir=str(logs / f"baseline{name}"))
            before.append(
                run_once(
                    profiled, cfg, logs / f"baseline{name}.log", timeout_s, "baseline" + label, show_progress
                )
            )
        cfg = HookConfig("real", iters, warm, result_dir=str(logs / f"verify{name}"), min_seconds=min_seconds)
        results.append(
            run_once(command, cfg, logs / f"verify{name}.log", timeout_s, "verify" + label, show_progress)
        )
    report["verify"] = verify_result(report, results, warm, command, baseline=before or None)
    write_report(report, out)
    return report["verify"]


def run_once(
    command: list[str],
    cfg: HookConfig,
    log: Path,
    timeout_s: float,
    label: str,
    progress: bool,
    extra_env: dict[str, str] | None = None,
    unit: str = "iterations",
) -> dict:
    """One run of ``command`` under the hook, with the cores other processes used beside it (``extra_env``:
    a change for the hook to apply, as ``dsanalyzer fix`` gives it; ``unit``: what its progress counts)."""
    bar = ProgressBar(f"{label:>12}", progress, unit=unit)
    with SysMonitor() as mon:
        try:
            result = run_child(command, cfg, log, timeout_s, bar.update, extra_env)
        finally:
            bar.close()
    others = [v for v in mon.series()["other_cpu_cores"] if v is not None]
    result["other_cpu_cores"] = statistics.mean(others) if others else None
    return result

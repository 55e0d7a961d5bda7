"""``dsanalyzer verify REPORT -- <command>``: run the changed job and set its rate beside the prediction.

The report's verdict ends with a change (``num_workers``, ``cache_bytes``) and the samples/s the model
predicts with it. The user applies the change to the job and runs ``verify`` with the new command:
the job runs once under the import hook from a cold cache (as the profile's real run), long enough
to reach its steady state (one epoch of warm-up by default: a cache the change adds starts empty),
and the model predicts the configuration the run *actually* used (its loader's worker count and cache,
read from the loader, not from the command line). ``report.json`` gains ``verify``; report.html shows
it; the terminal prints both numbers and the error.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from dsanalyzer.intercept import HookConfig
from dsanalyzer.launch import ProfileError, ProgressBar, run_child
from dsanalyzer.report import load_report, write_report
from dsanalyzer.timeline import summarize
from dsanalyzer.whatif import Model

__all__ = ["verify_command", "verify_result", "verify_text", "TARGET_ERROR"]

TARGET_ERROR = 0.10  # the what-if model's accuracy goal for a verified change


def _warmup_for(report: dict) -> int:
    """One epoch of iterations plus the profile's warm-up: a new cache fills in the first epoch."""
    per_epoch = int((report.get("per_epoch_s") or {}).get("iters") or 0)
    return per_epoch + int(report.get("warmup_iters") or 5)


def verify_result(report: dict, run: dict, warmup: int, command: list[str]) -> dict:
    """The ``verify`` entry: the change found in the run's loader, predicted and measured samples/s."""
    model = Model.from_report(report)
    loader = run.get("loader") or {}
    workers = int(loader.get("num_workers", model.workers) or 0)
    cache = int(loader.get("cache_bytes") or 0)
    change: dict = {}
    if workers != model.workers:
        change["num_workers"] = workers
    if cache > 0:
        change["cache_bytes"] = cache
    policy = "minio" if cache > 0 else model.cache_policy
    cache_bytes = cache if cache > 0 else model.cache_bytes
    predicted = model.predict(
        cache_bytes, model.cpus, model.storage_bytes_per_s, policy=policy, workers=workers
    )
    try:
        measured = summarize(run["wait_s"], run["step_s"], run["batch_items"], warmup).samples_per_s
    except ValueError as e:
        raise ProfileError(f"verify run: {e}") from None
    error = (measured - predicted.samples_per_s) / predicted.samples_per_s
    fix = (report.get("verdict") or {}).get("fix") or {}
    return {
        "command": [str(a) for a in command],
        "change": change,
        "recommended_change": fix.get("change"),
        "loader": loader,
        "predicted_samples_per_s": predicted.samples_per_s,
        "predicted_bound": predicted.bound,
        "measured_samples_per_s": measured,
        "error": error,
        "within_target": bool(math.isfinite(error) and abs(error) <= TARGET_ERROR),
        "target_error": TARGET_ERROR,
        "iters": max(0, min(len(run["wait_s"]), len(run["step_s"])) - warmup),
        "warmup_iters": warmup,
    }


def verify_text(v: dict) -> str:
    """Predicted vs measured, side by side, for the terminal."""
    change = ", ".join(f"{k}={val}" for k, val in (v.get("change") or {}).items()) or "no change"
    mark = "within" if v["within_target"] else "outside"
    return (
        f"verify ({change}): predicted {v['predicted_samples_per_s']:,.1f} samples/s "
        f"({v['predicted_bound']}-bound) | measured {v['measured_samples_per_s']:,.1f} samples/s | "
        f"error {v['error']:+.1%} ({mark} the ±{v['target_error']:.0%} target; "
        f"{v['iters']} iterations after {v['warmup_iters']} warm-up)"
    )


def verify_command(
    report_path: str | os.PathLike,
    command: list[str],
    iters: int = 60,
    warmup: int | None = None,
    timeout_s: float = 600.0,
    show_progress: bool = True,
) -> dict:
    """Run ``command`` (the changed job) once from a cold cache; add ``verify`` to the report; return it."""
    if not command:
        raise ProfileError("verify: give the changed training command after `--`")
    report = load_report(report_path)
    out = Path(report_path)
    out = out if out.is_dir() else out.parent
    warm = _warmup_for(report) if warmup is None else warmup
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    cfg = HookConfig("real", str(logs / "verify"), iters, warm, (1,), None, 1 << 30)
    for stale in Path(cfg.result_dir).glob("*"):
        stale.unlink()  # a previous verify's result must not be read as this one's
    bar = ProgressBar("      verify", show_progress)
    try:
        run = run_child(command, cfg, logs / "verify.log", timeout_s, bar.update)
    finally:
        bar.close()
    report["verify"] = verify_result(report, run, warm, command)
    write_report(report, out)
    return report["verify"]

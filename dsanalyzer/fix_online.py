"""``dsanalyzer fix --online -- python train.py ...``: the fix found in one run of the unmodified script.

``dsanalyzer fix`` profiles the job (four runs) and then measures each change beside your configuration (two
runs a round): any job it changes costs at least six runs of the script. ``--online`` runs it once: the
script's torch ``DataLoader`` is built as ``coordl.DataLoader`` through the import hook, and the loader
the script iterates first tunes itself (``tune=True``, :mod:`coordl.tune`): it measures its first epoch
with your settings, then tries at each epoch's start the changes its model predicts to gain (the number of
workers, ``prefetch_factor``, the trainer's intra-op threads; every promising one at once first), keeps
what measured at least 3% faster and reverts the rest. The hook stops the script once the tuner has nothing
left to try, or after ``epochs`` epochs (:mod:`dsanalyzer.measure.online`).

The table holds each change the tuner tried, its predicted and measured samples/s, against your settings as
measured in the same run; the change to keep is the kept knobs as a patch of the script's loader call (the
call site from the loader's construction stack, or from ``report_path``'s profile) and a
``torch.set_num_threads`` line. The patch keeps your loader class: the knobs are torch's too.

What it costs: one run lasting the epochs it needs (one with your settings, one or two per change tried).
It suits jobs whose epochs last seconds to minutes; a job whose epoch lasts an hour is fixed faster by
the profile (``dsanalyzer fix`` without ``--online``), which needs only ~100 iterations per run.
What it does not try: the remedies that need the profile's model (the MinIO cache, the sample cache,
read-ahead, more nodes): ``cache_bytes`` and ``fetch_ahead`` are fixed per loader (:mod:`coordl.tune`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from dsanalyzer.fix import write_fix
from dsanalyzer.judge.fixplan import Config
from dsanalyzer.judge.loadercode import change_text
from dsanalyzer.measure.apply import Change
from dsanalyzer.measure.hookconfig import HookConfig
from dsanalyzer.measure.launch import ProfileError
from dsanalyzer.measure.machine import available_cpus
from dsanalyzer.profiler import default_out_dir
from dsanalyzer.report.schema import load_report
from dsanalyzer.verify import run_once

__all__ = ["fix_online", "DEFAULT_EPOCHS"]

DEFAULT_EPOCHS = 8  # your settings, then the changes: a tuner settles in 2-5 epochs (bench_fix)
_UNBOUNDED = 1 << 40  # iterations: the hook stops the run when the tuner is done, not at a count


def fix_online(
    command: list[str],
    out_dir: str | os.PathLike | None = None,
    report_path: str | os.PathLike | None = None,
    epochs: int = DEFAULT_EPOCHS,
    timeout_s: float = 600.0,
    show_progress: bool = True,
) -> dict:
    """Run ``command`` once with its loader tuning itself (the module docstring); returns what ``fix.json``
    holds (the changes tried, the change kept, its patch)."""
    if not command:
        raise ProfileError(
            "fix: give the training command after `--`, e.g. dsanalyzer fix --online -- python train.py"
        )
    if not 2 <= epochs <= 100:
        raise ProfileError(
            f"fix --online: --epochs must be 2-100 (your settings, then a change), got {epochs}"
        )
    site = None
    if report_path is not None:  # an earlier profile names the loader's call: only that loader is switched
        site = (load_report(report_path).get("loader") or {}).get("site")
        out = (
            Path(out_dir)
            if out_dir
            else Path(report_path)
            if Path(report_path).is_dir()
            else Path(report_path).parent
        )
    else:
        out = (
            Path(out_dir)
            if out_dir
            else default_out_dir(next((a for a in command[1:] if a.endswith(".py")), command[0]))
        )
    (out / "logs").mkdir(parents=True, exist_ok=True)
    cfg = HookConfig("real", _UNBOUNDED, 0, result_dir=str(out / "logs" / "online"), tune_epochs=epochs)
    change = Change(switch_to="coordl.DataLoader", site=site).to_env()
    started = time.perf_counter()
    run = run_once(
        command, cfg, out / "logs" / "online.log", timeout_s, "online", show_progress, change, unit="epochs"
    )
    run["wall_s"] = time.perf_counter() - started
    tune = run.get("tune") or {"error": "the run recorded no tuning"}
    if tune.get("error"):
        raise ProfileError(f"fix --online: {tune['error']} (log: {out / 'logs' / 'online.log'})")
    if not tune.get("first_items_per_s"):
        raise ProfileError(
            f"fix --online: the script ran {tune.get('epochs', 0)} epoch(s), too few items to measure one "
            f"(the tuner needs an epoch of 256 items or more; log: {out / 'logs' / 'online.log'})"
        )
    loader, kept = run.get("loader") or {}, _kept(tune)
    return write_fix(_result(command, run, tune, site or loader.get("site"), kept), out, kept)


def _kept(tune: dict) -> Config:
    """The knobs the tuner kept, as the change to the script (what differs from your settings)."""
    first, kept = tune["first_knobs"], tune["knobs"]
    threads = kept["intra_op_threads"] if kept["intra_op_threads"] != first["intra_op_threads"] else None
    args = {k: kept[k] for k in ("num_workers", "prefetch_factor") if kept[k] != first[k]}
    if args.get("num_workers") == 0:
        args.pop("prefetch_factor", None)
    return Config(threads, args, "")


def _code(knob: str, report: dict) -> str:
    """A tuner's change (``intra_op_threads=1+num_workers=4``) as the script's code."""
    parts = dict(p.split("=", 1) for p in knob.split("+"))
    lines = []
    if "intra_op_threads" in parts:
        lines.append(change_text({"torch_threads": int(parts.pop("intra_op_threads"))}, report))
    if parts:
        lines.append(change_text({k: int(v) for k, v in sorted(parts.items())}, report))
    return "; ".join(lines)


def _result(command: list[str], run: dict, tune: dict, site: dict | None, kept: Config) -> dict:
    base = float(tune["first_items_per_s"])
    report = {"loader": {**(run.get("loader") or {}), "class": "torch.utils.data.DataLoader"}}
    rounds = []
    for n, e in enumerate(tune["log"], 1):
        measured = float(e["measured_items_per_s"])
        rounds.append({
            "round": n, "name": e["knob"], "change": _code(e["knob"], report), "epoch": e["epoch"],
            "predicted_samples_per_s": e["predicted_items_per_s"], "before_samples_per_s": e["before_items_per_s"],
            "measured_samples_per_s": measured, "speedup": measured / base if base > 0 else 0.0,
            "status": "kept" if e["kept"] else "reverted",
        })  # fmt: skip
    # nothing kept: your settings, whatever later epochs at them measured (the host's drift, not a change)
    final = float(tune.get("items_per_s") or base) if kept != Config() else base
    return {
        "online": True, "command": [str(a) for a in command], "site": site, "dry_run": False, "plan": [],
        "cpus": available_cpus(), "epochs": tune["epochs"], "most_epochs": tune["most_epochs"],
        "settled": tune["settled"], "first_knobs": tune["first_knobs"], "kept_knobs": tune["knobs"],
        "base_samples_per_s": base, "final_samples_per_s": final, "speedup": final / base if base > 0 else 1.0,
        "rounds": rounds, "runs": 1, "wall_s": run.get("wall_s"),
    }  # fmt: skip

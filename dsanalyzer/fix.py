"""``dsanalyzer fix -- python train.py ...``: profile the job, apply the remedy the model ranks first to the
unmodified script, measure it, and repeat while another bound binds (at most ``rounds`` rounds).

1. **Profile** (:func:`dsanalyzer.profiler.profile_command`; ``report_path``: an existing profile instead).
2. **Each round**: the next step (:func:`dsanalyzer.judge.fixplan.next_step`: the cheapest remedy that
   removes the stall within this machine's cores and memory, else the one that gains most, predicted for
   the job with the changes kept so far), run with the changes kept so far through the import hook
   (:mod:`dsanalyzer.measure.apply`: no edit to the script), run under the hook as ``verify`` runs a job
   (from a cold cache, the epochs a new cache needs to fill dropped, then ``iters`` measured), alternated
   ``runs`` times with the changes kept so far alone (round 1: your configuration), so that both see the
   same minutes of a shared machine; while the pairs leave it in doubt (their ratios on both sides of 1,
   or their medians within :data:`DOUBT` of each other) up to :data:`EXTRA_PAIRS` more pairs are run, so
   that one noisy run does not decide. A change is kept only when it measured at least
   :data:`KEEP_GAIN` (3%) faster than those;
   otherwise it is reverted and the next remedy is tried (a remedy reverted is tried again only once
   another change has been kept: the job it was measured on has changed). The speedup over your
   configuration is the kept rounds' ratios multiplied, each measured within its round.
3. **The table** (each round's change, predicted and measured samples/s, the speedup over your
   configuration) and **the change to keep**, as a unified diff of the script's loader call (found from
   the loader's construction stack) or the lines to add (:mod:`dsanalyzer.report.patch`).

``dry_run``: profile and print the plan (the steps if each measured as predicted) without running them.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import psutil

from dsanalyzer.judge.fixplan import Config, Step, applied_model, next_step, plan
from dsanalyzer.judge.loadercode import change_text
from dsanalyzer.judge.remedies import current
from dsanalyzer.judge.verify import run_rate, warmup_for
from dsanalyzer.measure.apply import Change
from dsanalyzer.measure.hookconfig import HookConfig
from dsanalyzer.measure.launch import ProfileError
from dsanalyzer.model.whatif import Model
from dsanalyzer.report.files import atomic_write_text
from dsanalyzer.report.patch import lines_to_add, script_patch
from dsanalyzer.report.schema import load_report
from dsanalyzer.verify import run_once

__all__ = [
    "fix_command",
    "write_fix",
    "memory_budget",
    "forced_step",
    "in_doubt",
    "DOUBT",
    "EXTRA_PAIRS",
    "KEEP_GAIN",
]

# a round whose two sides' medians are closer than this (or whose pairs disagree) is in doubt: on the 2-core
# host under load 10-15 one run of the same configuration spread +-20-30% from the next (bench_fix's grid)
DOUBT = 0.15
EXTRA_PAIRS = 2  # the most pairs added to a round in doubt
# a change is kept only if it measured at least this much faster (tune=True's min_gain): a change that
# does nothing measures +-1-3% by noise alone, and keeping it would print a patch for nothing
KEEP_GAIN = 0.03


def memory_budget(report: dict) -> float:
    """Memory a fix may hold (a cache): half of what is available now, at most half the machine's."""
    total = float((report.get("machine") or {}).get("memory_bytes") or 0.0) or float("inf")
    return min(psutil.virtual_memory().available / 2, total / 2)


def forced_step(report: dict, change: dict) -> Step:
    """A step made of ``change`` (test-only ``--force-step``): ``torch_threads``, ``switch_to`` and loader
    arguments, predicted by the model as any step is."""
    change = dict(change)
    threads = change.pop("torch_threads", None)
    switch = change.pop("switch_to", "")
    config = Config(threads, change, switch)
    pred = current(applied_model(Model.from_report(report), config))
    code = change_text({"torch_threads": threads} if threads is not None else change, report)
    return Step("forced", code, pred.samples_per_s, pred.bound, threads, change, switch)


class _Runner:
    """Runs the command under the hook with one configuration and measures it as ``verify`` does."""

    def __init__(self, command: list[str], out: Path, iters: int, warmup: int, runs: int, min_seconds: float,
                 timeout_s: float, progress: bool, site: dict | None) -> None:  # fmt: skip
        self.command, self.out, self.iters, self.warmup, self.runs = command, out, iters, warmup, runs
        self.min_seconds, self.timeout_s, self.progress, self.site = min_seconds, timeout_s, progress, site

    def _one(self, tag: str, label: str, config: Config) -> dict:
        env = None  # the script as written: no change in its environment
        if config != Config():
            env = Change(config.torch_threads, config.loader_args, config.switch_to, self.site).to_env()
        cfg = HookConfig("real", self.iters, self.warmup, result_dir=str(self.out / "logs" / tag),
                         min_seconds=self.min_seconds)  # fmt: skip
        return run_once(
            self.command, cfg, self.out / "logs" / f"{tag}.log", self.timeout_s, label, self.progress, env
        )

    def pair(self, n: int, before: Config, after: Config) -> tuple[dict[str, list[float]], list[dict]]:
        """Round ``n``: ``before`` (the changes kept so far) and ``after`` (with the step) alternated ``runs``
        times, so that both see the same minutes of a shared machine; (each side's rates, ``after``'s results)."""
        rates: dict[str, list[float]] = {"before": [], "after": []}
        results = []
        i = 0
        while i < self.runs or (i < self.runs + EXTRA_PAIRS and in_doubt(rates["before"], rates["after"])):
            i += 1
            part = f" {i}" if i > 1 or self.runs > 1 else ""
            for side, config in (("before", before), ("after", after)):
                r = self._one(f"fix-{n}-{side}-{i}", f"round {n} {side}{part}", config)
                rates[side].append(run_rate(r, self.warmup)["samples_per_s"])
                if side == "after":
                    results.append(r)
        return rates, results


def in_doubt(before: list[float], after: list[float]) -> bool:
    """Whether alternated runs leave a change undecided: the pairs' ratios fall on both sides of 1, or
    the two sides' medians are within :data:`DOUBT` of each other."""
    if not before or not after:
        return False
    ratios = [a / b for a, b in zip(after, before, strict=True) if b > 0]
    if any(r > 1 for r in ratios) and any(r <= 1 for r in ratios):
        return True
    ratio = statistics.median(after) / max(statistics.median(before), 1e-12)
    return 1 - DOUBT < ratio < 1 + DOUBT


def _median_idle(results: list[dict]) -> float | None:
    """The cores the host left idle in these runs' measured batches, their median (None: not measured)."""
    idle = [float(c) for r in results if (c := (r.get("job_cpu") or {}).get("idle_cores")) is not None]
    return statistics.median(idle) if idle else None


def _not_applied(result: dict, config: Config) -> str | None:
    """Why the run did not have the configuration asked for (None: it had it), from its loader's facts."""
    loader = result.get("loader") or {}
    if config.torch_threads is not None and loader.get("torch_threads") != config.torch_threads:
        return f"the main process ran {loader.get('torch_threads')} intra-op threads"
    if config.switch_to and not str(loader.get("class", "")).startswith("coordl."):
        return f"the loader was {loader.get('class')}, not {config.switch_to}"
    for key in ("num_workers", "cache_bytes", "fetch_ahead", "prefetch_factor"):
        if key in config.loader_args and loader.get(key) != config.loader_args[key]:
            return f"the loader ran {key}={loader.get(key)}"
    return None


def _round(n: int, step: Step, before: float, after: float, status: str, speedup: float) -> dict:
    """One round's row: ``before`` the kept changes alone, ``after`` with this step, measured alternately;
    ``speedup`` this round's configuration over yours (the kept rounds' ratios times this one's)."""
    return {"round": n, "name": step.name, "change": step.code, "predicted_samples_per_s": step.predicted_samples_per_s,
            "predicted_bound": step.bound, "before_samples_per_s": before, "measured_samples_per_s": after,
            "speedup": speedup, "status": status}  # fmt: skip


def fix_command(
    command: list[str],
    out_dir: str | os.PathLike | None = None,
    report_path: str | os.PathLike | None = None,
    profile_iters: int = 100,
    iters: int = 60,
    warmup: int | None = None,
    runs: int = 1,
    min_seconds: float = 0.0,
    rounds: int = 3,
    timeout_s: float = 600.0,
    show_progress: bool = True,
    dry_run: bool = False,
    force_step: dict | None = None,
) -> dict:
    """Profile ``command`` (or read ``report_path``), then apply, measure and keep or revert each step
    (the module docstring); returns what ``fix.json`` holds (the rounds, the change kept, its patch)."""
    if not command:
        raise ProfileError(
            "fix: give the training command after `--`, e.g. dsanalyzer fix -- python train.py"
        )
    if not 1 <= rounds <= 10 or runs < 1:
        raise ProfileError(f"fix: --rounds must be 1-10 and --runs >= 1, got {rounds} and {runs}")
    if report_path is not None:
        report = load_report(report_path)
        out = Path(report_path) if Path(report_path).is_dir() else Path(report_path).parent
    else:
        from dsanalyzer.profiler import profile_command

        report = profile_command(command, out_dir=out_dir, iters=profile_iters, timeout_s=timeout_s,
                                 show_progress=show_progress, min_seconds=min_seconds)  # fmt: skip
        out = Path(report.pop("_out_dir"))
    budget = memory_budget(report)
    site = (report.get("loader") or {}).get("site")
    model = Model.from_report(report)
    result: dict = {"command": [str(a) for a in command], "report": str(out / "report.json"), "site": site,
                    "cpus": model.cpus, "memory_budget_bytes": budget, "bound": (report.get("verdict") or {}).get("bound"),
                    "predicted_samples_per_s": current(model).samples_per_s, "rounds": [], "dry_run": dry_run}  # fmt: skip
    first = forced_step(report, force_step) if force_step else None
    result["plan"] = [s.as_json() for s in ([first] if first else plan(report, rounds, budget))]
    if dry_run or not result["plan"]:
        return write_fix(result, out, Config())
    warm = warmup_for(report) if warmup is None else warmup
    runner = _Runner(command, out, iters, warm, runs, min_seconds, timeout_s, show_progress, site)
    result.update(iters=iters, warmup_iters=warm, runs=runs)
    kept, chain, excluded = Config(), 1.0, set[str]()  # chain: the kept changes' speedup, round by round
    idle: float | None = None  # the cores the host left idle in the runs at ``kept`` (None: the profile's)
    for n in range(1, rounds + 1):
        step = (
            first
            if n == 1 and first is not None
            else next_step(report, kept, budget, frozenset(excluded), idle)
        )
        if step is None:
            result["stopped"] = "no further step"  # nothing else the hook can change is predicted to gain
            break
        config = kept.with_step(step)
        rates, runs_ = runner.pair(n, kept, config)
        before, after = statistics.median(rates["before"]), statistics.median(rates["after"])
        if n == 1:
            result["base_samples_per_s"] = before  # your configuration, measured beside round 1
        why = _not_applied(runs_[0], config)
        ratio = after / before if before > 0 else 0.0
        if why is None and ratio >= 1.0 + KEEP_GAIN:
            status, kept, chain = "kept", config, chain * ratio
            idle = _median_idle(runs_)
            result["final_samples_per_s"] = after
            excluded.clear()  # the job changed: a remedy reverted before may help it now
        else:
            status = f"not applied ({why})" if why else "reverted"
            excluded.add(step.name)
        row = _round(n, step, before, after, status, chain if status == "kept" else chain * ratio)
        result["rounds"].append({**row, "before_runs": rates["before"], "after_runs": rates["after"]})
    result["speedup"] = chain
    result.setdefault("final_samples_per_s", result["base_samples_per_s"])
    return write_fix(result, out, kept)


def write_fix(result: dict, out: Path, kept: Config) -> dict:
    """The change to keep (its patch, or the lines to add), written to ``fix.json`` beside the report."""
    result["kept"] = kept.as_json()
    if kept != Config():
        result["patch"] = script_patch(result["site"], kept.loader_args, kept.switch_to, kept.torch_threads)
        result["lines_to_add"] = lines_to_add(kept.loader_args, kept.switch_to, kept.torch_threads)
    atomic_write_text(out / "fix.json", json.dumps(result, indent=1, default=str))
    result["path"] = str(out / "fix.json")
    return result

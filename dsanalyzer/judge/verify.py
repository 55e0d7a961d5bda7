"""Judging ``dsanalyzer verify``: the changed job's measured rate beside the model's prediction.

(The runs themselves are :mod:`dsanalyzer.verify`'s; this module only reads their results.)

The report's verdict ends with a change (``num_workers``, ``cache_bytes``) and the samples/s the model
predicts with it. The user applies the change to the job and runs ``verify`` with the new command:
the job runs once under the import hook from a cold cache (as the profile's real run), long enough
to reach its steady state (the epochs that read every item once, by default: a cache the change adds
starts empty, see :func:`fill_epochs`),
and the model predicts the configuration the run *actually* used (its loader's worker count and cache,
read from the loader, not from the command line). ``report.json`` gains ``verify``; report.html shows
it; the terminal prints both numbers and the error.

On a shared machine one run is not a measurement: on the 2-core CI VM three runs of the same changed
demo job, minutes apart, measured 1,115, 897 and 750 samples/s, because the step alone took 25, 34 and
38 ms (`reports/bench_whatif.md`). ``runs=N`` runs the job N times; the measured rate is their median,
with the spread and each run's step time beside it, and the step time of the profile's full-job run
(items from memory) for comparison: when the error is outside the target and the step itself moved
by more than the target, the text says that the machine moved, with both numbers.

The step is not the only thing that moves: on that VM the same remote-prep job, with a step of 0.1 ms,
measured 1,035 and 1,127 samples/s half an hour apart, and the job without the change moved with it.
With ``baseline`` (runs of the profiled command itself, made beside the changed runs and measured as the
profile's real run was), :func:`rebased` scales the prediction by how far the unchanged job moved since
the profile, and the target is judged on that error; the error against the profile's own minutes stays
beside it. This is the benchmarks' rule (a ratio against a baseline measured in the same run) applied to
the prediction: the model predicts the change, not the machine's next half hour.
"""

from __future__ import annotations

import math
import statistics

from dsanalyzer.judge.verdict import OTHER_CPU_SHARE
from dsanalyzer.measure.launch import ProfileError
from dsanalyzer.measure.timeline import summarize
from dsanalyzer.model.measured import other_cpu_cores
from dsanalyzer.model.remote_prep import RemoteSetup, with_remote
from dsanalyzer.model.whatif import Model

__all__ = [
    "verify_result",
    "run_rate",
    "fill_epochs",
    "rebased",
    "warmup_for",
    "TARGET_ERROR",
    "PAUSE_FACTOR",
]

TARGET_ERROR = 0.10  # the what-if model's accuracy goal for a verified change
PAUSE_FACTOR = 5.0  # a step this many times the median (and 0.1 s over it): the process paused
_PAUSE_NOTE_SHARE = 0.01  # pauses worth naming: 1% of a run's time


def fill_epochs(items: int, per_epoch_iters: int, batch: int) -> int:
    """Epochs until a shuffled job has likely read every item once (so a cache holding them is full).

    An epoch that loads all items fills it in one. With ``drop_last``, each epoch leaves out the
    ``d`` items past the last whole batch, a fresh random ``d`` each time: after ``e`` epochs about
    ``N (d/N)^e`` items were never read, under one when ``e > ln N / ln(N/d)`` (two epochs for
    1,500 items in batches of 32; the demo's verify missed 27 items in its second epoch, each a read
    from the slow storage the cache was meant to remove).
    """
    dropped = items - per_epoch_iters * batch
    if per_epoch_iters <= 0 or dropped <= 0 or dropped >= items:
        return 1
    return min(4, max(1, math.ceil(math.log(items) / math.log(items / dropped))))


def warmup_for(report: dict) -> int:
    """The epochs that fill a new cache, plus the profile's warm-up.

    The loader's own ``len`` and ``drop_last`` (recorded by the profile) say how many batches an epoch
    has and whether items are left out; older reports give the epoch as ``ceil(items / batch)``.
    """
    loader = report.get("loader") or {}
    items = int((report.get("dataset") or {}).get("items") or 0)
    per_epoch = int(loader.get("batches_per_epoch") or (report.get("per_epoch_s") or {}).get("iters") or 0)
    epochs = 1
    if loader.get("drop_last"):
        epochs = fill_epochs(items, per_epoch, int(report.get("batch_size") or 1))
    return epochs * per_epoch + int(report.get("warmup_iters") or 5)


def _measured(run: dict, warmup: int) -> dict:
    """One run's rate, its block-median step and wait, and the pauses of the training process itself.

    A pause is a step that took more than :data:`PAUSE_FACTOR` times the median step and 0.1 s more:
    the process did not run (a VM's stolen time, memory reclaim, another tenant), whatever the loader
    did. On the 2-core VM a 30 ms emulated step once took 1,256 ms; the rate counts it, as real time
    lost, and ``samples_per_s_without_pauses`` shows what the loader delivered without it.
    """
    try:
        summary = summarize(run["wait_s"], run["step_s"], run["batch_items"], warmup)
    except ValueError as e:
        raise ProfileError(f"verify run: {e}") from None
    n = min(len(run["wait_s"]), len(run["step_s"]), len(run["batch_items"]))
    skip = min(warmup, max(0, n - 1))
    steps = run["step_s"][skip:n]
    total_s = sum(run["wait_s"][skip:n]) + sum(steps)
    extra = [
        t - summary.step_s for t in steps if t > PAUSE_FACTOR * summary.step_s and t - summary.step_s > 0.1
    ]
    items = sum(run["batch_items"][skip:n])
    kept_s = total_s - sum(extra)
    return {
        "samples_per_s": summary.samples_per_s,
        "step_s": summary.step_s,
        "wait_s": summary.wait_s,
        "pauses": len(extra),
        "pause_s": sum(extra),
        "longest_step_s": max(steps, default=0.0),
        "pause_share": sum(extra) / total_s if total_s > 0 else 0.0,
        "samples_per_s_without_pauses": items / kept_s if kept_s > 0 else summary.samples_per_s,
    }


def run_rate(run: dict, warmup: int) -> dict:
    """One run's measured samples/s (after ``warmup`` iterations), step, wait and pauses (:func:`_measured`)."""
    return _measured(run, warmup)


def _profile_step_s(report: dict) -> float | None:
    """The step's time in the profile's full-job run with items from memory (run 2), if recorded."""
    step = (((report.get("runs") or {}).get("prep") or {}).get("summary") or {}).get("step_s")
    return float(step) if isinstance(step, (int, float)) and step > 0 else None


def verify_result(
    report: dict,
    run: dict | list[dict],
    warmup: int,
    command: list[str],
    baseline: list[dict] | None = None,
) -> dict:
    """The ``verify`` entry: the change found in the run's loader, predicted and measured samples/s.

    ``run`` is one run's result or several (runs of the same command): the measured rate is their
    median, and ``runs`` lists each one. ``baseline``: runs of the profiled command made beside them
    (:func:`rebased`).
    """
    runs = run if isinstance(run, list) else [run]
    model = Model.from_report(report)
    loader = runs[0].get("loader") or {}
    workers = int(loader.get("num_workers", model.workers) or 0)
    cache = int(loader.get("cache_bytes") or 0)
    ahead = loader.get("fetch_ahead")  # a bucket's read-ahead threads per worker (None: an older dsanalyzer)
    ahead = int(ahead) if isinstance(ahead, int) else None
    change: dict = {}
    if workers != model.workers:
        change["num_workers"] = workers
    if model.store is not None and ahead is not None and ahead != model.fetch_ahead:
        change["fetch_ahead"] = ahead
    if cache > 0:
        change["cache_bytes"] = cache
    policy = "minio" if cache > 0 else model.cache_policy
    cache_bytes = cache if cache > 0 else model.cache_bytes
    predicted = model.predict(
        cache_bytes, model.cpus, model.storage_bytes_per_s, policy=policy, workers=workers, fetch_ahead=ahead
    )
    remote = int(loader.get("remote_cpus") or 0)
    wire = loader.get("remote_wire_bytes") or model.remote_wire_bytes
    if remote > 0 and wire:  # the run prepped on remote CPUs too (coordl's remote_prep=)
        change["remote_cpus"] = remote
        setup = RemoteSetup(remote, float(wire))
        predicted = with_remote(model, predicted, setup, model.cpus, model.compute_rate())
    each = [_measured(r, warmup) for r in runs]
    measured = statistics.median(m["samples_per_s"] for m in each)
    error = (measured - predicted.samples_per_s) / predicted.samples_per_s
    fix = (report.get("verdict") or {}).get("fix") or {}
    out = {
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
        "iters": max(0, min(len(runs[0]["wait_s"]), len(runs[0]["step_s"])) - warmup),
        "warmup_iters": warmup,
        "runs": each,
        "measured_range": [min(m["samples_per_s"] for m in each), max(m["samples_per_s"] for m in each)],
        "measured_without_pauses_samples_per_s": statistics.median(
            m["samples_per_s_without_pauses"] for m in each
        ),
        "step_s_measured": statistics.median(m["step_s"] for m in each),
        "step_s_profile": _profile_step_s(report),
        "other_cpu_cores": _median_or_none([r.get("other_cpu_cores") for r in runs]),
        "other_cpu_cores_profile": _max_or_none(
            [other_cpu_cores(report, r) for r in ("prep_scaling", "prep")]
        ),
        "cpus": model.cpus,
    }
    if remote > 0 and wire:
        out["remote_split"] = remote_split(runs, warmup, predicted.stage_rates, measured)
    if baseline:
        out["baseline"] = rebased(report, baseline, predicted.samples_per_s, measured)
        error = out["baseline"]["error"]
        out["within_target"] = bool(math.isfinite(error) and abs(error) <= TARGET_ERROR)
    out["note"] = "" if out["within_target"] else _machine_note(out)  # the causes measured, if outside
    return out


def remote_split(runs: list[dict], warmup: int, predicted: dict, measured: float) -> dict | None:
    """The measured rate split between the remote CPUs and the local workers (the loader's
    ``remote_items`` over the measured batches, median share of the runs) beside the model's split;
    None when the runs kept no count."""
    shares = []
    for r in runs:
        items = sum(r["batch_items"][warmup:])
        remote = (r.get("loader_counters") or {}).get("remote_items")
        if remote is not None and items > 0:
            shares.append(min(1.0, float(remote) / items))
    if not shares:
        return None
    share = statistics.median(shares)
    return {
        "remote_share": share,
        "measured_remote_samples_per_s": share * measured,
        "measured_local_samples_per_s": (1 - share) * measured,
        "predicted_remote_samples_per_s": predicted.get("remote"),
        "predicted_local_samples_per_s": predicted.get("local_with_remote"),
    }


def rebased(report: dict, runs: list[dict], predicted: float, measured: float) -> dict:
    """The prediction scaled by how far the profiled job moved since the profile: ``runs`` of its own
    command, each measured as the profile's real run (its warm-up dropped, samples over the time), their
    median against the profile's observed rate."""
    warm = int(report.get("warmup_iters") or 5)
    try:
        rates = [summarize(r["wait_s"], r["step_s"], r["batch_items"], warm).samples_per_s for r in runs]
    except (KeyError, ValueError) as e:
        raise ProfileError(f"verify baseline run: {e}") from None
    then = float((report.get("rates_per_s") or {}).get("observed") or 0.0)
    if then <= 0:
        raise ProfileError("verify --baseline: the report has no observed rate (rates_per_s.observed)")
    now = statistics.median(rates)
    drift = now / then
    return {
        "runs_samples_per_s": rates,
        "samples_per_s": now,
        "profile_samples_per_s": then,
        "drift": drift,
        "predicted_samples_per_s": predicted * drift,
        "error": measured / (predicted * drift) - 1 if predicted > 0 else math.nan,
    }


def _max_or_none(values: list) -> float | None:
    known = [float(v) for v in values if v is not None]
    return max(known) if known else None


def _median_or_none(values: list) -> float | None:
    known = [float(v) for v in values if v is not None]
    return statistics.median(known) if known else None


def _machine_note(v: dict) -> str:
    """Why a result outside the target may not be the model's: the step itself moved, other processes
    took cores, or the runs disagreed."""
    notes = []
    step, then = v.get("step_s_measured"), v.get("step_s_profile")
    if step and then and abs(step / then - 1) > v["target_error"]:
        notes.append(
            f"the step itself took {step * 1e3:.1f} ms here vs {then * 1e3:.1f} ms in the profile "
            f"({step / then - 1:+.0%}): the machine moved, not only the loader"
        )
    notes += _interference_notes(v)
    notes += _pause_notes(v)
    lo, hi = v.get("measured_range") or (None, None)
    if lo and hi and len(v.get("runs") or []) > 1 and hi / lo - 1 > v["target_error"]:
        notes.append(f"the {len(v['runs'])} runs spread {lo:,.0f}-{hi:,.0f} samples/s")
    return "; ".join(notes)


def _pause_notes(v: dict) -> list[str]:
    """The training process itself stalled (steps far over their median), with the rate without it."""
    runs = v.get("runs") or []
    paused = [(i, r) for i, r in enumerate(runs, 1) if r.get("pause_share", 0.0) >= _PAUSE_NOTE_SHARE]
    if not paused:
        return []
    worst_i, worst = max(paused, key=lambda ir: ir[1]["pause_share"])
    clean = v["measured_without_pauses_samples_per_s"]
    error = clean / v["predicted_samples_per_s"] - 1
    steps = f"{worst['pauses']} step" + ("s" if worst["pauses"] != 1 else "")
    return [
        f"the training process itself paused outside the loader in {len(paused)} of {len(runs)} runs "
        f"(run {worst_i}: {steps} of up to {worst['longest_step_s'] * 1e3:,.0f} ms against a median of "
        f"{worst['step_s'] * 1e3:.1f} ms, {worst['pause_share']:.0%} of its time); without the pauses the "
        f"median is {clean:,.1f} samples/s ({error:+.1%})"
    ]


def _interference_notes(v: dict) -> list[str]:
    """Other processes on the cores during the verify runs, or while the profile measured the rates."""
    cpus, busy = v.get("cpus") or 0, OTHER_CPU_SHARE * (v.get("cpus") or 0)
    now, then = v.get("other_cpu_cores"), v.get("other_cpu_cores_profile")
    notes = []
    if now is not None and cpus and now >= busy:
        before = f" ({then:.2f} while the profile measured prep)" if then is not None else ""
        notes.append(
            f"interference: other processes used {now:.2f} of the {cpus} cores during these runs{before}"
        )
    elif then is not None and cpus and then >= busy:
        notes.append(
            f"interference during the profile: other processes used {then:.2f} of the {cpus} cores while it "
            "measured prep, so the prediction rests on rates of a busier machine"
            + (f" ({now:.2f} during these runs)" if now is not None else "")
        )
    return notes

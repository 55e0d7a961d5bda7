"""The report's verdict: the model's bound at the measured rates, its check against the run, and the fix, in three steps:

1. **Bound.** The what-if model (:mod:`dsanalyzer.model.whatif`) evaluated at the measured configuration
   names the binding stage; that is the bound the verdict states.
2. **Check.** The model's samples/s is compared with the real run's. The run's own spread is the
   p10..p90 range of its per-block rates (blocks of consecutive iterations, as the summaries use);
   a gap wider than that spread is a disagreement, reported with the numbers and with the causes the
   run *measured*: a cold cache (the run read fewer items than the dataset, so every read was a first
   read, while the model's steady state counts cache hits), other processes' CPU time (the system
   monitor's ``other_cpu_cores``), too few iterations (a spread wider than 15%). When none of them
   shows, the report says so rather than guessing.
3. **Fix.** The top of the ranked remedies (:mod:`dsanalyzer.judge.remedies`): the cheapest change that
   makes the job compute-bound (else the one that gains most), as the arguments or the line to change
   (``torch.set_num_threads(1)``, ``num_workers``, ``cache_bytes``...) and the samples/s the model predicts
   with it. The sentence names that remedy and the list begins with it.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from dsanalyzer.judge import skew
from dsanalyzer.judge.epochs import epoch_start_note
from dsanalyzer.judge.loadercode import is_dali, workers_noun
from dsanalyzer.judge.remedies import ranked, ranked_text, top_fix
from dsanalyzer.model import search
from dsanalyzer.model.measured import other_cpu_cores
from dsanalyzer.model.rates import Prediction
from dsanalyzer.model.remedy import Remedy
from dsanalyzer.model.store import StoreModel, loader_concurrency
from dsanalyzer.model.whatif import Model, format_bytes

# fmt: off
__all__ = ["verdict", "advice_sentence", "rate_spread", "recommend", "is_dali", "workers_noun",
           "threads_note"]
# fmt: on

_FEW_ITERS_SPREAD = 0.15  # a block-rate spread above this: the run was too short (or too noisy) to read
OTHER_CPU_SHARE = 0.10  # other processes using this share of the cores: interference
_CACHE_MARGIN = (
    1.10  # the recommended cache is this much above the model's threshold, never above the dataset
)


def rate_spread(report: dict, run: str = "real", blocks: int = 8) -> dict | None:
    """Median and p10/p90 samples/s over blocks of the run's iterations (warm-up dropped)."""
    entry = (report.get("runs") or {}).get(run) or {}
    wait, step = entry.get("wait_s") or [], entry.get("step_s") or []
    n = min(len(wait), len(step))
    skip = min(int(report.get("warmup_iters") or 0), max(0, n - 1))
    total = np.asarray(wait[skip:n], dtype=float) + np.asarray(step[skip:n], dtype=float)
    if total.size < 2:
        return None
    parts = np.array_split(total, max(1, min(blocks, total.size // 4)))
    batch = float(report.get("batch_size") or 1)
    rates = np.array([batch / p.mean() for p in parts if p.size and p.mean() > 0])
    if rates.size == 0:
        return None
    return {
        "median": float(np.median(rates)),
        "p10": float(np.percentile(rates, 10)),
        "p90": float(np.percentile(rates, 90)),
        "blocks": int(rates.size),
        "iters": int(total.size),
    }


def _causes(report: dict, model: Model, pred: Prediction, spread: dict | None, gap: float) -> list[str]:
    """The causes of a disagreement that the run measured, one sentence each.

    A cold cache and other processes slow a run down: they are named only for a run slower than the model.
    """
    causes = []
    runs = report.get("runs") or {}
    read = len((runs.get("real") or {}).get("wait_s") or []) * model.batch_size
    slower = gap < 0
    if slower and pred.hit_ratio > 0.05 and read < model.dataset_items:
        causes.append(
            f"cold cache: the real run read {read} of {model.dataset_items} items, all first reads, "
            f"while the model's steady state has a hit ratio of {pred.hit_ratio:.2f}"
        )
    other = other_cpu_cores(report)
    if slower and other is not None and other >= OTHER_CPU_SHARE * model.cpus:
        per_core = (report.get("sysmon") or {}).get("cpu_percent_per_core") or [[]]
        machine = max(model.cpus, len(per_core[0]) if per_core and per_core[0] else 0)
        had = "" if machine == model.cpus else f" (the job had {model.cpus})"
        where = f"the {model.cpus} cores" if not had else f"the machine's {machine} cores{had}"
        causes.append(f"interference: other processes used {other:.2f} of {where} during the real run")
    if spread is not None:
        width = (spread["p90"] - spread["p10"]) / 2 / spread["median"]
        if width > _FEW_ITERS_SPREAD:
            causes.append(
                f"too few iterations: the real run's rate varied by ±{width:.0%} over {spread['iters']} "
                "iterations; profile with more (--iters)"
            )
    return causes


def recommend(model: Model) -> dict | None:
    """The change that makes the job compute-bound here, with its predicted samples/s.

    Workers first (prep), then a MinIO cache (fetch) at that worker count; None when the job is
    compute-bound already or no change on this machine gets there.
    """
    target = model.compute_rate()
    current = model.predict_measured()
    if current.bound == "compute":
        return None
    change: dict = {}
    workers = model.workers
    cores = model.cores_for_rate(target)
    if cores is not None and max(1, workers) < cores <= model.cpus:  # prep cannot keep up at this count
        workers = cores
        change["num_workers"] = workers
    kw: dict = {"cpus": model.cpus, "storage_bytes_per_s": model.storage_bytes_per_s, "workers": workers}
    at_workers = model.predict(model.cache_bytes, policy=model.cache_policy, **kw)
    if at_workers.bound == "fetch" and model.store is not None:  # a bucket: more requests in flight first
        ahead = search.fetch_ahead_for_rate(model, target, workers)
        if ahead != model.fetch_ahead:
            change["fetch_ahead"] = ahead
            kw["fetch_ahead"] = ahead
            at_workers = model.predict(model.cache_bytes, policy=model.cache_policy, **kw)
    if at_workers.bound == "fetch":
        need = search.cache_bytes_for_rate(
            model, target, model.cpus, model.storage_bytes_per_s, "minio", fetch_ahead=kw.get("fetch_ahead")
        )
        if need is None:
            need = model.dataset_bytes  # the most a cache can do: everything in memory
        cache = int(min(model.dataset_bytes, math.ceil(need * _CACHE_MARGIN / 1e6) * 1e6))
        change["cache_bytes"] = cache
        predicted = model.predict(cache, policy="minio", **kw)
    else:
        predicted = at_workers
    if not change:
        return None
    out = {"change": change, "predicted_samples_per_s": predicted.samples_per_s, "bound": predicted.bound}
    if 0 < change.get("cache_bytes", 0) < model.dataset_bytes:
        out["note"] = PARTIAL_MINIO_NOTE
    return out


# Measured by benchmarks/bench_whatif_accuracy.py (synthetic family, reports/bench_whatif.md): runs with
# a partly filled MinIO cache came in below the what-if by this much; stated wherever a fix relies on one.
PARTIAL_MINIO_NOTE = (
    "with part of the dataset in the MinIO cache, the accuracy benchmark measured runs 0.5-8.3% below "
    "the what-if on a quiet machine, up to 29% with one worker on a loaded one (reports/bench_whatif.md): "
    "read the prediction as an upper bound"
)


def verdict(report: dict) -> dict:
    """Bound, check against the measured run, causes and fix, as JSON-ready fields.

    ``bound`` is the bound the verdict states; ``model_bound`` the model's at the measured rates;
    ``measured_bound`` the stalls' (report.json's top-level ``bound``). They differ only with
    ``bound_note`` saying why, with the numbers; the verdict states the measured bound when the
    model also misses the real run's rate and no measured cause explains the miss.
    """
    model = Model.from_report(report)
    pred = model.predict_measured()
    observed = float((report.get("rates_per_s") or {}).get("observed") or 0.0)
    spread = rate_spread(report)
    gap = (observed - pred.samples_per_s) / pred.samples_per_s if pred.samples_per_s > 0 else 0.0
    if spread is not None and spread["median"] > 0:
        allowed = max(spread["median"] - spread["p10"], spread["p90"] - spread["median"]) / spread["median"]
    else:
        allowed = 0.0
    disagrees = abs(gap) > allowed
    measured = report.get("bound")
    causes = _causes(report, model, pred, spread, gap) if disagrees else []
    # The stalls are the better evidence when the model misses the real run and no measured cause
    # (a cold cache, other processes) explains why; otherwise the model's steady state is.
    follow_stalls = measured in _BOUNDS and measured != pred.bound and disagrees and not causes
    stated = measured if follow_stalls else pred.bound
    remedies = ranked(model, report, recommend(model))
    fix = top_fix(remedies, model)
    out = {
        "bound": stated,
        "model_bound": pred.bound,
        "measured_bound": measured,
        "bound_note": None,
        "predicted_samples_per_s": pred.samples_per_s,
        "observed_samples_per_s": observed,
        "gap": gap,
        "spread": allowed,
        "disagrees": disagrees,
        "causes": causes,
        "overhead": _overhead(model),
        "epoch_start": epoch_start_note(report, model, pred),
        "more_cores": _more_cores(report, model, pred),
        "skew": skew.finding(model, report),  # the in-order loss of the measured prep spread
        "fix": fix,
        "remedies": [r.as_json() for r in remedies],
    }
    if measured in _BOUNDS and measured != pred.bound:
        out["bound_note"] = _bound_note(report, model, pred, stated)
    out["sentence"] = _sentence(model, pred, out, workers_noun(report))
    return out


_BOUNDS = ("compute", "prep", "fetch")


def _more_cores(report: dict, model: Model, pred: Prediction) -> dict:
    """The what-if at twice the cores (one worker per core), beside the measured configuration's rate."""
    cpus = 2 * model.cpus
    more = model.predict(model.cache_bytes, cpus, model.storage_bytes_per_s, policy=model.cache_policy)
    out = {
        "cpus": cpus,
        "samples_per_s": more.samples_per_s,
        "rises": more.samples_per_s > pred.samples_per_s * 1.02,
        "note": threads_note(model, cpus, cpus),
    }
    return out


def threads_note(model: Model, cpus: int, workers: int, **predict_kw: Any) -> str | None:
    """What torch's default intra-op threads cost on ``cpus`` cores beside ``workers`` workers, and the
    rate with one thread (None when the prediction charges no spinning threads: see model/cores.py)."""
    spin = model.spin_cores(cpus, workers)
    if spin <= 0:
        return None
    kw = {"cache_bytes": model.cache_bytes, "storage_bytes_per_s": model.storage_bytes_per_s,
          "policy": model.cache_policy, **predict_kw}  # fmt: skip
    now = model.predict(cpus=cpus, workers=workers, **kw).samples_per_s
    single = replace(model, torch_threads=1, threads_follow_cores=False)
    one = single.predict(cpus=cpus, workers=workers, **kw)
    return (
        f"on {cpus} cores torch runs {cpus} intra-op threads in the main process (its default follows the "
        f"cores); between the step's parallel regions the idle ones spin, holding about {spin:.2f} of the "
        f"cores the loader workers need: the what-if counts that ({now:,.0f} samples/s); "
        f"torch.set_num_threads(1) in the training script would give {one.samples_per_s:,.0f} samples/s"
    )


def _bound_note(report: dict, model: Model, pred: Prediction, stated: str | None) -> str:
    """Why the stalls as measured and the model name different bounds, with both sets of numbers."""
    per = report.get("per_iter_s") or {}
    total = sum(float(per.get(k) or 0.0) for k in _STALLS)
    stages = pred.stage_rates
    in_memory = min(stages.get("prep", math.inf), stages.get("cpu", math.inf))
    text = (
        f"the stalls as measured name {report.get('bound')} (prep stall {float(per.get('prep_stall') or 0) * 1e3:.1f} ms, "
        f"fetch stall {float(per.get('fetch_stall') or 0) * 1e3:.1f} ms of a {total * 1e3:.1f} ms iteration; "
        "a stall under 5% of the iteration counts as none), the model names "
        f"{pred.bound} (compute with the main process's own work {stages.get('compute', math.nan):,.0f}, "
        f"prep {in_memory:,.0f}, fetch {stages.get('fetch', math.nan):,.0f} samples/s)"
    )
    if stated != pred.bound:
        text += f"; the model's {pred.samples_per_s:,.0f} samples/s misses the real run, so the verdict follows the stalls"
    return text


_STALLS = ("compute", "prep_stall", "fetch_stall")


def _overhead(model: Model) -> dict | None:
    """The main process's per-batch cost that caps the job below the step-alone rate, when there is one."""
    if model.batch_overhead_s <= 0:
        return None
    return {
        "batch_overhead_s": model.batch_overhead_s,
        "step_alone_samples_per_s": model.compute_per_s,
        "ceiling_samples_per_s": model.compute_rate(),
        "text": (
            f"the step alone runs at {model.compute_per_s:,.0f} samples/s, but the main process spends "
            f"{model.batch_overhead_s * 1e3:.1f} ms of its own CPU per batch receiving it from the loader "
            f"(CPU time in the in-memory run), so the job tops out at {model.compute_rate():,.0f} samples/s"
        ),
    }


def _sentence(model: Model, pred: Prediction, v: dict, noun: str) -> str:
    bound = v["bound"]
    parts = [f"{bound}-bound: the model predicts {pred.samples_per_s:,.0f} samples/s at the measured rates"]
    if pred.bound == "fetch" and model.store is not None:
        parts[0] += f" ({store_text(model, model.store)}, hit ratio {pred.hit_ratio:.2f})"
    elif pred.bound == "fetch":
        parts[0] += f" (storage {format_bytes(model.storage_bytes_per_s)}/s, hit ratio {pred.hit_ratio:.2f})"
    if v["disagrees"]:
        if v["causes"]:
            why = "; ".join(v["causes"])
        elif v["gap"] > 0:
            stages = ", ".join(
                f"{k} {r:,.0f}" for k, r in sorted(pred.stage_rates.items()) if math.isfinite(r)
            )
            why = (
                f"the job ran faster than the model's slowest stage (stage rates {stages} samples/s): "
                "a measured stage rate is below what the job reached"
            )
        else:
            why = (
                "none of the measured causes shows (cache cold, other processes, few iterations): "
                "the model misses a cost of this job"
            )
        parts.append(
            f"the real run measured {v['observed_samples_per_s']:,.0f} samples/s ({v['gap']:+.0%}, "
            f"beyond its own spread of ±{v['spread']:.0%}): {why}"
        )
    else:
        parts.append(f"the real run agrees ({v['observed_samples_per_s']:,.0f} samples/s)")
    if v["bound_note"]:
        parts.append(v["bound_note"])
    if v["overhead"] is not None and bound == "compute" and pred.bound == "compute":
        parts.append(v["overhead"]["text"])
    if v["epoch_start"] is not None:
        parts.append(v["epoch_start"]["text"])
    if v["skew"] is not None and v["skew"]["binds"]:
        parts.append(v["skew"]["text"])
    fix, more = v["fix"], v["more_cores"]
    if fix is not None:
        parts.append(f"fix: {fix['code']}, predicted {fix['predicted_samples_per_s']:,.0f} samples/s")
        if fix.get("note"):
            parts.append(fix["note"])
        if fix["bound"] != "compute":
            parts.append(f"then {fix['bound']}-bound: {_no_fix_text(model, fix['bound'], noun)}")
    elif bound == "compute" and not more["rises"]:
        parts.append("more cores, cache or storage speed will not help")
    elif bound == "compute":
        parts.append(f"with {more['cpus']} cores the what-if predicts {more['samples_per_s']:,.0f} samples/s")
    else:
        parts.append(_no_fix_text(model, bound, noun))
    if more["note"] and more["rises"] and bound != "compute":
        parts.append(more["note"])
    if len(v["remedies"]) > 1 or (v["remedies"] and fix is None):  # the first is the fix above
        parts.append(ranked_text([Remedy(**r) for r in v["remedies"]], model.compute_rate()))
    return "; ".join(parts) + "."


def _no_fix_text(model: Model, bound: str, noun: str) -> str:
    need = search.to_compute_bound(model)
    if bound == "prep":
        if need["cpus_needed"] is None:
            return "prep saturates however many cores it gets: make prep cheaper (cache decoded samples)"
        kw: dict = {"policy": model.cache_policy}
        more = model.predict(model.cache_bytes, 2 * model.cpus, model.storage_bytes_per_s, **kw)
        return (
            f"{need['cpus_needed']} CPU cores for data prep would make it compute-bound (this machine has "
            f"{model.cpus}; with {2 * model.cpus} the what-if predicts {more.samples_per_s:,.0f} samples/s)"
        )
    storage = need["storage_bytes_per_s_needed"]
    if storage:
        return f"storage at {format_bytes(storage)}/s would make it compute-bound"
    return f"no cache or storage speed on this machine makes it compute-bound; add {noun}"


def store_text(model: Model, store: StoreModel) -> str:
    """The bucket's fitted rates (``store``, the model's) in words, at the loader's concurrency."""
    c = loader_concurrency(model.workers, model.fetch_ahead)
    more = store.request_rate_is_lower_bound or store.bandwidth_is_lower_bound
    return (
        f"a bucket: {store.latency_s * 1e3:.1f} ms round trip, {c} requests in flight "
        f"({store.bound(c, model.avg_item_bytes, model.items_per_request)}-bound); it served "
        f"{store.request_rate:,.0f} requests/s and {format_bytes(store.bandwidth_bytes_per_s)}/s"
        + (" (or more: the probe did not reach its ceiling)" if more else "")
    )


def advice_sentence(report: dict) -> str:
    """The verdict as one sentence (what ``report.json`` stores under ``advice``)."""
    return verdict(report)["sentence"]

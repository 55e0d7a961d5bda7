"""The verdict's ranked remedies: every remedy that applies to the job, predicted, best first.

Each remedy's rate is its own module's pure function (:mod:`dsanalyzer.model`); this module asks each
for its :class:`~dsanalyzer.model.remedy.Remedy` at the size that would make the job compute-bound (or
the most the remedy can do), and :func:`~dsanalyzer.model.remedy.rank` orders them: those that remove
the stall, cheapest first, then the rest, fastest first, then those that cannot be predicted here.
The top of the list is the verdict's fix (:func:`top_fix`), with its exact arguments or line; the
remedies on this machine are the trainer's intra-op threads, more workers, read-ahead, a MinIO cache
and the sample cache (the last three switch a torch loader to ``coordl.DataLoader``). A remedy's cost
lists only what is not zero: the memory it holds, the cores its added workers take, nodes, remote CPUs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from dsanalyzer.judge import skew
from dsanalyzer.judge.loadercode import COORDL_ARGS, change_text, is_dali
from dsanalyzer.model import gpu_prep, partitioned, remote_prep, sample_cache
from dsanalyzer.model.rates import Prediction
from dsanalyzer.model.remedy import Remedy, rank
from dsanalyzer.model.whatif import Model, format_bytes

__all__ = ["ranked", "ranked_text", "top_fix", "current", "PROVIDERS", "GAIN", "cost_text"]

GAIN = 0.02  # a remedy that predicts less than this much above the job as it runs is not offered


def current(model: Model, **changed: object) -> Prediction:
    """The steady prediction at the profiled configuration (``changed``: settings replaced), the rate
    every remedy is compared with (cold reads are the profile's, not the remedy's)."""
    kw: dict = {"cache_bytes": model.cache_bytes, "cpus": model.cpus, "policy": model.cache_policy,
                "storage_bytes_per_s": model.storage_bytes_per_s, "workers": model.workers, **changed}  # fmt: skip
    return model.predict(**kw)


def _switch(report: dict, args: dict) -> str:
    """The loader class ``args`` need when the job's loader is torch's (coordl's own arguments)."""
    cls = str((report.get("loader") or {}).get("class", ""))
    if cls.startswith("coordl.") or is_dali(report) or not any(k in args for k in COORDL_ARGS):
        return ""
    return "coordl.DataLoader"


def _local_fix(model: Model, report: dict, fix: dict | None) -> list[Remedy]:
    """The change ``recommend`` found on this machine (workers, read-ahead, a MinIO cache), as a remedy."""
    if fix is None:
        return []
    change = fix["change"]
    name = "cache" if "cache_bytes" in change else "fetch_ahead" if "fetch_ahead" in change else "workers"
    cost: dict = {}
    if "cache_bytes" in change:
        cost["memory_bytes"] = float(change["cache_bytes"])
    if change.get("num_workers", 0) > model.workers:
        cost["cores"] = change["num_workers"] - model.workers  # the added workers' cores, busy with prep
    return [
        Remedy(
            name,
            fix["predicted_samples_per_s"],
            fix["bound"],
            cost,
            dict(change),
            fix.get("note", ""),
            code=change_text(change, report),
            switch_to=_switch(report, change),
        )  # fmt: skip
    ]


def _threads(model: Model, report: dict) -> list[Remedy]:
    """One intra-op thread in the main process, where torch's default threads spin beside the workers
    (a CPU step; :mod:`~dsanalyzer.model.cores`): the cores they hold go back to the workers."""
    spin = model.spin_cores(model.cpus, model.workers)
    if spin <= 0:
        return []
    now = current(model).samples_per_s
    one = current(replace(model, torch_threads=1, threads_follow_cores=False))
    if one.samples_per_s <= now * (1 + GAIN):
        return []
    note = (
        f"torch's {model.cpus if model.threads_follow_cores else model.torch_threads} intra-op threads in the "
        f"main process hold about {spin:.2f} of the cores the workers need while they spin between the "
        "step's parallel regions; the step's own rate is the one measured (a step that needs its threads "
        "may slow down: verify)"
    )
    return [Remedy("threads", one.samples_per_s, one.bound, {}, {}, note, code="torch.set_num_threads(1)",
                   torch_threads=1)]  # fmt: skip


def _workers(model: Model, report: dict) -> list[Remedy]:
    """The fewest workers (up to this machine's cores) that reach the most the workers alone can do."""
    now = current(model).samples_per_s
    best: tuple[int, Prediction] | None = None
    for k in range(max(1, model.workers + 1), model.cpus + 1):
        p = current(model, workers=k)
        if best is None or p.samples_per_s > best[1].samples_per_s * 1.001:
            best = (k, p)
    if best is None or best[1].samples_per_s <= now * (1 + GAIN):
        return []
    k, p = best
    change = {"num_workers": k}
    return [Remedy("workers", p.samples_per_s, p.bound, {"cores": k - model.workers}, change,
                   code=change_text(change, report))]  # fmt: skip


def _sample_cache(model: Model, report: dict) -> list[Remedy]:
    """The sample cache holding every sample's deterministic prefix, or as many as half the machine's
    memory holds (only where the profile measured the split of prep: a coordl loader's split source)."""
    if model.det_cpu_s is None or not model.cached_sample_bytes:
        return _sample_cache_unknown(model, report)
    memory = float((report.get("machine") or {}).get("memory_bytes") or 0.0)
    whole = model.dataset_items * model.cached_sample_bytes
    size = min(whole, memory / 2) if memory > 0 else whole
    return [sample_cache.remedy(model, size)]


def _sample_cache_unknown(model: Model, report: dict) -> list[Remedy]:
    """A prep-bound torch loader: the sample cache needs coordl.DataLoader, whose probe measures what a
    cached sample saves; without it the remedy is listed, unknown, with how to predict it."""
    loader = str((report.get("loader") or {}).get("class", ""))
    if loader.startswith("coordl.") or is_dali(report) or current(model).bound != "prep":
        return []
    why = (
        "what a cached sample saves is probed for a coordl.DataLoader over a source that splits its prep "
        "(coordl.ImageFolder): profile the job with coordl.DataLoader to predict it"
    )
    args = {"sample_cache": "memcache.LocalStore(BYTES)"}
    return [Remedy("sample_cache", None, loader_args=args, why_unknown=why, switch_to="coordl.DataLoader",
                   code=change_text(args, report))]  # fmt: skip


_MAX_REMOTE_CPUS = 256


def _remote_cpus(model: Model, report: dict) -> list[Remedy]:
    """Remote CPUs of a Ray cluster: the fewest that make the job compute-bound (or the most that still
    add), where the profile measured what a remote sample weighs (a coordl loader's compact recipe)."""
    if not model.remote_wire_bytes or model.predict_measured().bound != "prep":
        return []  # remote CPUs add prep, not storage bandwidth
    local = model.predict_measured()
    compute = model.compute_rate()
    best = None
    for n in (*range(1, 17), 24, 32, 48, 64, 96, 128, 192, _MAX_REMOTE_CPUS):
        setup = remote_prep.RemoteSetup(n, model.remote_wire_bytes)
        r = remote_prep.remedy(model, local, setup, model.cpus, compute)
        if best is not None and (r.samples_per_s or 0) <= (best.samples_per_s or 0) * 1.001:
            break  # no more gain: the trainer's cores, not the remote ones, bind
        best = r
        if r.removes_stall(compute):
            break
    return [] if best is None else [best]


def _nodes(model: Model, report: dict) -> list[Remedy]:
    """The partitioned cache over the fewest nodes (2-16) whose caches make the job compute-bound, or
    that reach the most, each caching its share of the dataset (only for a fetch-bound job that reads
    files: the remedy of reads, not of prep)."""
    if model.fetch_free or model.predict_measured().bound != "fetch":
        return []
    link = partitioned.DEFAULT_PEER_GBPS * 1e9 / 8
    compute, best = model.compute_rate(), None
    for n in range(2, 17):
        r = partitioned.nodes_remedy(model, n, link)
        if best is None or (r.samples_per_s or 0) > (best.samples_per_s or 0) * 1.001:
            best = r
        if r.removes_stall(compute):
            break
    return [] if best is None else [best]


def _gpu_prep(model: Model, report: dict) -> list[Remedy]:
    """GPU prep for a prep-bound job: predicted from the profile's GPU probe, else unknown (and why)."""
    if model.predict_measured().bound != "prep":
        return []
    return [gpu_prep.gpu_prep_remedy(model)]


def _in_order(model: Model, report: dict) -> list[Remedy]:
    """``in_order=False`` where skewed prep times bind a prep-bound job (:mod:`dsanalyzer.judge.skew`)."""
    return skew.in_order_remedy(model, report, current(model))


# Each provider: (model, report) -> the remedies it offers this job (none when it does not apply), each a
# pure function of the model and what the report measured. Coordinated prep is not one of them: it
# shares one job's prep with other jobs over the same dataset and does not speed up a job alone
# (``whatif --jobs K`` answers it).
Provider = Callable[[Model, dict], list[Remedy]]
PROVIDERS: list[Provider] = [_threads, _in_order, _workers, _sample_cache, _remote_cpus, _gpu_prep, _nodes]


def _with_code(r: Remedy, report: dict) -> Remedy:
    """``r`` with its exact call filled in (from its loader arguments) and the loader switch it needs."""
    args = dict(r.loader_args)
    code = r.code or change_text(args, report)
    return replace(r, code=code, switch_to=r.switch_to or _switch(report, args))


def ranked(model: Model, report: dict, fix: dict | None) -> list[Remedy]:
    """Every applicable remedy, ranked (:func:`~dsanalyzer.model.remedy.rank`); ``fix`` is ``recommend``'s."""
    remedies = _local_fix(model, report, fix)
    seen = {(r.name, tuple(sorted(r.loader_args.items()))) for r in remedies}
    for provider in PROVIDERS:
        for r in provider(model, report):
            if (r.name, tuple(sorted(r.loader_args.items()))) not in seen:
                remedies.append(_with_code(r, report))
    return rank(remedies, model.compute_rate())


def top_fix(remedies: list[Remedy], model: Model) -> dict | None:
    """The verdict's fix: the top of the ranked list, when it is predicted and raises the rate (else None)."""
    r = remedies[0] if remedies else None
    if r is None or r.samples_per_s is None or r.samples_per_s <= current(model).samples_per_s * (1 + GAIN):
        return None
    change = dict(r.loader_args) if r.torch_threads is None else {"torch_threads": r.torch_threads}
    out = {"name": r.name, "change": change, "code": r.code, "predicted_samples_per_s": r.samples_per_s,
           "bound": r.bound}  # fmt: skip
    if r.note:
        out["note"] = r.note
    return out


def cost_text(cost: dict) -> str:
    """A remedy's cost in words, its non-zero parts only (``""``: it costs nothing but the change)."""
    parts = []
    for key, value in cost.items():
        if value is None or (isinstance(value, float) and math.isnan(value)) or not value:
            continue
        if key == "memory_bytes":
            parts.append(f"{format_bytes(value)} memory" + (" per node" if cost.get("nodes") else ""))
        elif key == "gpu_prep_share":
            parts.append(f"{value:.0%} of the job's GPU")
        else:
            parts.append(f"{value:g} {key.replace('_', ' ')}")
    return ", ".join(parts)


def _args_text(args: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in args.items())


def ranked_text(remedies: list[Remedy], compute_rate: float) -> str:
    """The ranked list in one clause: ``remedies, best first: 1. ...; 2. ...``."""
    items = []
    for n, r in enumerate(remedies, 1):
        if r.samples_per_s is None:
            items.append(f"{n}. {r.name}: unknown ({r.why_unknown})")
            continue
        fixes = " (removes the stall)" if r.removes_stall(compute_rate) else ""
        cost = cost_text(r.cost)
        items.append(
            f"{n}. {r.name} ({r.code or _args_text(r.loader_args)}): {r.samples_per_s:,.0f} samples/s{fixes}"
            + (f", costs {cost}" if cost else "")
        )
    return "remedies, best first: " + "; ".join(items) if items else ""

"""The verdict's ranked remedies: every coordl remedy that applies to the job, predicted, best first.

Each remedy's rate is its own module's pure function (:mod:`dsanalyzer.model`); this module asks each
for its :class:`~dsanalyzer.model.remedy.Remedy` at the size that would make the job compute-bound (or
the most the remedy can do), and :func:`~dsanalyzer.model.remedy.rank` orders them: those that remove
the stall, cheapest first, then the rest, fastest first, then those that cannot be predicted here.
The first that removes the stall is the fix, with its exact loader arguments.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from dsanalyzer.model import gpu_prep, partitioned, remote_prep, sample_cache
from dsanalyzer.model.remedy import Remedy, rank
from dsanalyzer.model.whatif import Model, format_bytes

__all__ = ["ranked", "ranked_text", "PROVIDERS"]


def _local_fix(model: Model, fix: dict | None) -> list[Remedy]:
    """The change ``recommend`` found on this machine (workers, read-ahead, a MinIO cache), as a remedy."""
    if fix is None:
        return []
    change = fix["change"]
    name = "cache" if "cache_bytes" in change else "fetch_ahead" if "fetch_ahead" in change else "workers"
    cost: dict = {"cores": model.cpus}
    if "cache_bytes" in change:
        cost["memory_bytes"] = float(change["cache_bytes"])
    return [
        Remedy(name, fix["predicted_samples_per_s"], fix["bound"], cost, dict(change), fix.get("note", ""))
    ]


def _sample_cache(model: Model, report: dict) -> list[Remedy]:
    """The sample cache holding every sample's deterministic prefix, or as many as half the machine's
    memory holds (only where the profile measured the split of prep: a coordl loader's split source)."""
    if model.det_cpu_s is None or not model.cached_sample_bytes:
        return []
    memory = float((report.get("machine") or {}).get("memory_bytes") or 0.0)
    whole = model.dataset_items * model.cached_sample_bytes
    size = min(whole, memory / 2) if memory > 0 else whole
    return [sample_cache.remedy(model, size)]


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


# Each provider: (model, report) -> the remedies it offers this job (none when it does not apply), each a
# pure function of the model and what the report measured. Coordinated prep is not one of them: it
# shares one job's prep with other jobs over the same dataset and does not speed up a job alone
# (``whatif --jobs K`` answers it).
Provider = Callable[[Model, dict], list[Remedy]]
PROVIDERS: list[Provider] = [_sample_cache, _remote_cpus, _gpu_prep, _nodes]


def ranked(model: Model, report: dict, fix: dict | None) -> list[Remedy]:
    """Every applicable remedy, ranked (:func:`~dsanalyzer.model.remedy.rank`)."""
    remedies = _local_fix(model, fix)
    for provider in PROVIDERS:
        remedies.extend(provider(model, report))
    return rank(remedies, model.compute_rate())


def _cost_text(cost: dict) -> str:
    parts = []
    for key, value in cost.items():
        if key == "memory_bytes":
            parts.append(f"{format_bytes(value)} memory")
        elif value is not None and not (isinstance(value, float) and math.isnan(value)):
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
        cost = _cost_text(r.cost)
        items.append(
            f"{n}. {r.name} ({_args_text(r.loader_args)}): {r.samples_per_s:,.0f} samples/s{fixes}"
            + (f", costs {cost}" if cost else "")
        )
    return "remedies, best first: " + "; ".join(items) if items else ""

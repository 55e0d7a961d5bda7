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


# Each provider: (model, report) -> the remedies it offers this job (none when it does not apply).
# The remedies of other modules join here (coordinated prep, the partitioned cache, the sample cache,
# GPU prep, remote CPUs), each a pure function of the model and what the report measured.
Provider = Callable[[Model, dict], list[Remedy]]
PROVIDERS: list[Provider] = []


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

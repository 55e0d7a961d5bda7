"""The what-if model's parameters, read from a report's measured fields (a dict: no file is opened here).

Every field the model needs is checked where it is read: a missing one, or one that is not a positive
finite number, is a ``ValueError`` that names the field (``dataset.avg_item_bytes``, ``fetch.bytes_per_s``),
so a report from a job that could not measure it says so instead of predicting from a guess.
"""

from __future__ import annotations

import math

from dsanalyzer.model.cache import POLICIES
from dsanalyzer.model.scaling import PrepScaling

__all__ = ["field", "positive", "batch_overhead_s", "model_fields"]


def field(report: dict, *keys: str, required: bool = True, default=None):
    """``report[k1][k2]...``; a missing (or null) field is an error naming it, or ``default`` when optional."""
    node = report
    for key in keys:
        if not isinstance(node, dict) or key not in node or node[key] is None:
            if required:
                raise ValueError(
                    f"report.json: missing field {'.'.join(keys)!r}, which the what-if model needs"
                )
            return default
        node = node[key]
    return node


def positive(value, name: str) -> float:
    """``value`` as a positive finite float, or an error naming the field."""
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"report.json: {name} must be a positive number, got {value}")
    return value


def batch_overhead_s(report: dict, batch: int, compute_per_s: float, prep_per_s: float, workers: int) -> float:
    """Main-process seconds per batch that add to the step (receiving a batch from a worker).

    Run 2 (the full job, items from memory) runs at ``1 / (1/G + overhead/B)`` when prep has room to
    spare; below both G and the loader-alone rate P(w), the gap is that overhead. When run 2 runs at
    about P(w), prep binds and the overhead cannot be told apart: 0. Run 2's rate is taken from its
    block-median iteration (``summary.iter_s``) where recorded, so that one pause of the process (a
    410 ms step among 30 ms ones in a demo profile) is not read as a per-batch cost of every batch.
    """
    rate2 = field(report, "runs", "prep", "samples_per_s", required=False)
    summary = field(report, "runs", "prep", "summary", required=False) or {}
    iter_s, items = summary.get("iter_s"), summary.get("batch_size")
    if isinstance(iter_s, (int, float)) and isinstance(items, (int, float)) and iter_s > 0 and items > 0:
        rate2 = items / iter_s
    if not rate2 or workers == 0 or not math.isfinite(float(rate2)) or float(rate2) <= 0:
        return 0.0
    rate2 = float(rate2)
    if rate2 >= 0.97 * prep_per_s or rate2 >= compute_per_s:
        return 0.0
    return max(0.0, batch / rate2 - batch / compute_per_s)


def _item_bytes(report: dict, items: int) -> float:
    """The mean item size: measured, else the dataset's bytes over its items; unknown is an error."""
    avg = field(report, "dataset", "avg_item_bytes", required=False)
    if not avg and not field(report, "dataset", "bytes", required=False):
        note = field(report, "dataset", "size_note", required=False, default=None)
        raise ValueError(f"report.json: the dataset's item size is unknown: {note or 'give --data DIR'}")
    if avg is None:
        avg = positive(field(report, "dataset", "bytes"), "dataset.bytes") / max(1, items)
    return positive(avg, "dataset.avg_item_bytes")


def _prep_points(report: dict) -> tuple[list, list]:
    """The measured (workers, samples/s) of the prep-scaling run; the prep rate at the run's workers without one."""
    scaling = field(report, "prep_scaling", required=False) or {}
    ks, rates = scaling.get("workers") or [], scaling.get("samples_per_s") or []
    if not ks:  # a single measured point: the prep rate at the run's worker count
        ks = [max(1, int(field(report, "workers", required=False, default=1)))]
        rates = [positive(field(report, "rates_per_s", "prep"), "rates_per_s.prep")]
    return list(ks), list(rates)


def model_fields(report: dict) -> dict:
    """Keyword arguments of :class:`~dsanalyzer.model.whatif.Model`, from a report.json's measured fields."""
    cpus = int(field(report, "machine", "cpus"))
    items = int(field(report, "dataset", "items"))
    avg = _item_bytes(report, items)
    ks, rates = _prep_points(report)
    storage_bw = positive(field(report, "fetch", "bytes_per_s"), "fetch.bytes_per_s")
    items_per_s = field(report, "fetch", "items_per_s", required=False)
    # per-item cost beyond bandwidth (open, request latency): what items/s shows that bytes/s does not
    overhead = 0.0 if not items_per_s else max(0.0, 1.0 / float(items_per_s) - avg / storage_bw)
    membw = field(report, "machine", "mem_bandwidth_bytes_per_s", required=False)
    policy = field(report, "cache_policy", required=False, default="pagecache")
    if policy not in POLICIES:
        raise ValueError(f"report.json: cache_policy {policy!r} is not one of {', '.join(POLICIES)}")
    workers = max(0, int(field(report, "workers", required=False, default=cpus)))
    batch = int(field(report, "batch_size"))
    compute = positive(field(report, "rates_per_s", "compute"), "rates_per_s.compute")
    prep = PrepScaling.fit(ks, rates, physical_cores=cpus)
    return {
        "dataset_items": items,
        "avg_item_bytes": avg,
        "batch_size": batch,
        "compute_per_s": compute,
        "prep": prep,
        "storage_bytes_per_s": storage_bw,
        "storage_overhead_s": overhead,
        "mem_bandwidth_bytes_per_s": float(membw) if membw else None,
        "cpus": cpus,
        "workers": workers,
        "cache_bytes": float(field(report, "cache_bytes", required=False, default=0.0)),
        "cache_policy": policy,
        "prep_points": tuple((int(k), float(r)) for k, r in zip(ks, rates, strict=True)),
        "batch_overhead_s": batch_overhead_s(report, batch, compute, prep.rate(min(max(workers, 1), cpus)), workers),
    }

"""Whether skewed per-sample prep times bind the job, and the remedy when they do: ``in_order=False``.

The profile times items spread over the dataset (report.json's ``prep_spread``,
:mod:`dsanalyzer.measure.prepspread`); :func:`~dsanalyzer.model.skew.in_order_loss` replays the loader's
in-order hand-out on batches drawn from those times at the job's batch size, workers and prefetch.
Skew binds when the job is prep-bound and in-order hand-out loses at least :data:`SKEW_LOSS` of its
rate: the verdict's sentence names it and the ranked remedies get ``in_order=False`` (torch's own
argument; coordl's loader takes it too), predicted at the rate as profiled over one minus the loss (the
loader-alone runs measured prep in order), at most the compute rate. Under the threshold, or not
prep-bound, the spread and the small loss are one line of the text report.
"""

from __future__ import annotations

import functools

from dsanalyzer.judge.loadercode import change_text, is_dali
from dsanalyzer.model.rates import Prediction
from dsanalyzer.model.remedy import Remedy
from dsanalyzer.model.skew import in_order_loss
from dsanalyzer.model.whatif import Model

__all__ = ["SKEW_LOSS", "finding", "in_order_remedy"]

SKEW_LOSS = 0.05  # in-order hand-out losing this share of a prep-bound job's rate: skew binds


@functools.lru_cache(maxsize=32)
def _loss(times: tuple[float, ...], batch: int, workers: int, prefetch: int) -> dict:
    """:func:`in_order_loss`, once per spread and settings (the verdict and its remedies both ask)."""
    return in_order_loss(times, batch, workers, prefetch)


def finding(model: Model, report: dict) -> dict | None:
    """The in-order loss at the job's settings and whether skew binds (None: no spread measured)."""
    spread = report.get("prep_spread") or {}
    times = spread.get("cpu_s") or []
    loader = report.get("loader") or {}
    if not times or is_dali(report):
        return None
    workers = int(loader.get("num_workers", model.workers) or 0)
    prefetch = int(loader.get("prefetch_factor") or 2)
    replay = _loss(tuple(times), max(1, model.batch_size), workers, prefetch)
    in_order = loader.get("in_order", True) is not False
    prep_bound = model.predict_measured().bound == "prep"
    binds = in_order and prep_bound and replay["loss"] >= SKEW_LOSS
    out = {**replay, "workers": workers, "batch_size": model.batch_size, "in_order": in_order,
           "binds": binds}  # fmt: skip
    ratio = spread.get("p99_over_p50")
    shape = f"p99/p50 {ratio:.1f}x" if ratio else "p99/p50 unknown"
    out["text"] = (
        f"skewed prep binds: per-sample prep p50 {spread['p50_s'] * 1e3:.2f} ms, p99 "
        f"{spread['p99_s'] * 1e3:.2f} ms ({shape}, {spread['n']} items); handing out batches of "
        f"{model.batch_size} in order over {workers} workers loses {replay['loss']:.0%} of the rate "
        "(a slow batch holds up the ready ones behind it): in_order=False takes it back"
        if binds
        else ""
    )
    return out


def in_order_remedy(model: Model, report: dict, now: Prediction) -> list[Remedy]:
    """``in_order=False`` where skew binds (:func:`finding`), predicted at ``now`` (the rate as profiled,
    what every remedy is compared with) / (1 - loss)."""
    f = finding(model, report)
    if f is None or not f["binds"]:
        return []
    compute = model.compute_rate()
    rate = min(compute, now.samples_per_s / (1.0 - f["loss"]))
    args = {"in_order": False}
    note = (
        f"batches come out in the order they finish (a seeded epoch's batch order is no longer fixed); "
        f"the replay of the loader's dispatch on the measured prep times predicts +{f['gain']:.0%}"
    )
    return [Remedy("in_order", rate, "compute" if rate >= compute else now.bound, {}, args, note,
                   code=change_text(args, report))]  # fmt: skip

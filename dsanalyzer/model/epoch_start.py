"""An epoch's start at another operating point: the measured start, its pipeline fill rescaled.

A new epoch's first batch waits longer than a steady one; the profile measures the excess
(``epoch_start_s``). It is a fixed part (workers starting, ``iter()``) plus the pipeline's fill, one
worker's first batch (:func:`fill_s`): every worker starts its first batch at once, so the fill is
``w * B / W`` with ``W`` the loader's rate. The fill scales with the loader's batch time, the rest
stays (:func:`epoch_start_at`). The demo's fetch-bound profile waits 0.8 s for its first batch at 81
samples/s; its cached fix fills in 50 ms: charging it the profile's start predicted the fix 59% low on
an H200.
"""

from __future__ import annotations

import math

from dsanalyzer.model import stages
from dsanalyzer.model.params import JobParams
from dsanalyzer.model.rates import Prediction

__all__ = ["fill_s", "epoch_start_at", "with_start"]


def fill_s(job: JobParams, steady: Prediction, workers: int) -> float:
    """Seconds one worker takes to make one batch at ``steady``'s operating point: ``w * B / W``, with
    ``W`` the loader's rate (fetch and worker cycle; the step not counted)."""
    data = min(steady.stage_rates.get("fetch", math.inf), steady.stage_rates.get("worker_cycle", math.inf))
    if not math.isfinite(data) or data <= 0:
        return 0.0
    return max(1, workers) * job.batch_size / data


def epoch_start_at(job: JobParams, steady: Prediction, workers: int, profiled_fill_s: float) -> float:
    """The epoch start at ``steady``'s operating point, from the one measured at the profiled one, whose
    fill was ``profiled_fill_s``: the fill part of the start scales with :func:`fill_s`, the rest stays."""
    if job.epoch_start_s <= 0:
        return 0.0
    if profiled_fill_s <= 0:
        return job.epoch_start_s
    filled = min(job.epoch_start_s, profiled_fill_s)
    return job.epoch_start_s - filled + filled * fill_s(job, steady, workers) / profiled_fill_s


def with_start(job: JobParams, steady: Prediction, workers: int) -> Prediction:
    """``steady`` with the epoch start charged at its operating point, as ``Model.predict`` charges it
    (for the remedies' what-ifs, which compose their own steady rate)."""
    if job.epoch_start_s <= 0:
        return steady
    measured = stages.point_at(job, policy=job.cache_policy)
    fill_then = fill_s(job, stages.steady(job, measured), job.workers)
    start = epoch_start_at(job, steady, workers, fill_then)
    return steady.with_epoch_start(start, job.epoch_items or job.dataset_items)

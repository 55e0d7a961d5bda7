"""An epoch's start at another operating point: a fixed part, plus the pipeline's fill where it is lost.

A new epoch's ``w`` workers each start a batch at once (new workers, ``iter()``, an empty pipeline),
so its first round of ``w = max(1, workers)`` batches arrives together after the fill, ``F = w * B / W``
(:func:`fill_s`, ``W`` the loader's rate). The profile measures what that round cost beyond ``w``
steady waits (``epoch_start_s``: :func:`dsanalyzer.measure.stalls.epoch_start`). Steady, a batch waits
``T = B / R - B / S`` (the rate ``R``, the step alone ``S``: :func:`typical_wait_s`), so the fill costs

    lost = max(0, F - w * T)

on top of the fixed part: all of ``F`` for a compute-bound job (the step idles while the pipeline fills),
about ``w`` steps for a data-bound one (the round hands the fill back; only the last round's steps run
after the workers are done). The measured start is split (:func:`split`) into the fill lost where it was
measured (as modelled, at most the whole start) and a fixed rest; at any other point the start is the
fixed rest plus that fill scaled by the ratio of the fill lost there to the fill lost then
(:func:`epoch_start_at`), so an error in the modelled ``F`` cancels.

The demo's fetch-bound profile on an H200 (two workers, 81 samples/s) waited 0.79 s for an epoch's first
batch and 0.03 s for its second: the round cost 50 ms, not the first batch's 0.41 s excess. Its cached fix
is prep-bound there and hands its fill back too, so it is charged the same 50 ms; charged the 0.41 s
unscaled, the fix was predicted 59% low.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsanalyzer.model import stages
from dsanalyzer.model.params import JobParams
from dsanalyzer.model.rates import Prediction

__all__ = [
    "Split",
    "fill_s",
    "typical_wait_s",
    "lost_fill_s",
    "profiled",
    "split",
    "epoch_start_at",
    "with_start",
]


def fill_s(job: JobParams, steady: Prediction, workers: int) -> float:
    """Seconds one worker takes to make one batch at ``steady``'s operating point: ``w * B / W``, with
    ``W`` the loader's rate (fetch and worker cycle; the step not counted)."""
    data = min(steady.stage_rates.get("fetch", math.inf), steady.stage_rates.get("worker_cycle", math.inf))
    if not math.isfinite(data) or data <= 0:
        return 0.0
    return max(1, workers) * job.batch_size / data


def typical_wait_s(job: JobParams, steady: Prediction) -> float:
    """A steady batch's wait at ``steady``'s point: its time ``B / R`` less the step's own."""
    rate = steady.steady
    if not math.isfinite(rate) or rate <= 0:
        return 0.0
    step = steady.per_iter_s.get("compute")
    if step is None:
        compute = steady.stage_rates.get("compute", math.inf)
        step = job.batch_size / compute if math.isfinite(compute) and compute > 0 else 0.0
    return max(0.0, job.batch_size / rate - step)


def lost_fill_s(job: JobParams, steady: Prediction, workers: int, rounds: int | None = None) -> float:
    """What the fill costs an epoch at ``steady``'s point: ``max(0, F - k * T)``, ``k = max(1, w)``; or
    ``rounds`` instead of ``k`` (how many batches the measured start counted)."""
    k = max(1, workers) if rounds is None else max(1, rounds)
    return max(0.0, fill_s(job, steady, workers) - k * typical_wait_s(job, steady))


def profiled(job: JobParams) -> Prediction:
    """The steady prediction at the operating point the profile measured (where the start was measured)."""
    return stages.steady(job, stages.measured_point(job))


@dataclass(frozen=True)
class Split:
    """The measured start, split: ``fixed`` stays at every point, ``filled`` scales with the fill lost."""

    fixed: float
    filled: float
    lost_then: float  # the fill lost at the profiled point, as modelled


def split(job: JobParams) -> Split:
    """The measured start's parts: the fill lost where it was measured (modelled, at most the whole start)
    and the rest. A report before rounds were measured (``epoch_start_round`` 1) charged its first batch
    alone, so its fill lost is ``F - T`` there. Where the model's fill is off (fresh workers run faster
    than steady ones beside a busy step), the ratio at two points still holds."""
    if job.epoch_start_s <= 0:
        return Split(0.0, 0.0, 0.0)
    lost = lost_fill_s(job, profiled(job), job.workers, rounds=job.epoch_start_round)
    filled = min(job.epoch_start_s, lost)
    return Split(job.epoch_start_s - filled, filled, lost)


def epoch_start_at(job: JobParams, steady: Prediction, workers: int, parts: Split | None = None) -> float:
    """The epoch start at ``steady``'s operating point: the fixed part plus the measured fill scaled by the
    fill lost here over the fill lost where it was measured (``parts``: :func:`split`, once per job)."""
    if job.epoch_start_s <= 0:
        return 0.0
    parts = parts or split(job)
    if parts.lost_then <= 0:
        return job.epoch_start_s
    return parts.fixed + parts.filled * lost_fill_s(job, steady, workers) / parts.lost_then


def with_start(job: JobParams, steady: Prediction, workers: int) -> Prediction:
    """``steady`` with the epoch start charged at its operating point, as ``Model.predict`` charges it
    (for the remedies' what-ifs, which compose their own steady rate)."""
    if job.epoch_start_s <= 0:
        return steady
    start = epoch_start_at(job, steady, workers)
    return steady.with_epoch_start(start, job.epoch_items or job.dataset_items)

"""``dsanalyzer whatif --jobs K`` and ``--sample-cache-gb G``: the remedies' predictions, printed.

Each remedy's rate is a pure function of the report's measured parameters
(:mod:`dsanalyzer.model.coordinate`, :mod:`dsanalyzer.model.sample_cache`); this module checks the
options against what the report measured and prints the prediction. ``whatif`` (:mod:`dsanalyzer.whatif_cli`)
ends with the per-job rate this returns as its last line, ``predicted_samples_per_s=<float>``.
"""

from __future__ import annotations

import argparse
import math
import sys

from dsanalyzer.model import coordinate, sample_cache, stages
from dsanalyzer.model.rates import Prediction
from dsanalyzer.model.whatif import Model, format_bytes

__all__ = ["add_remedy_options", "remedy_error", "remedy_ok", "print_remedy"]


def add_remedy_options(p: argparse.ArgumentParser) -> None:
    """Register ``--jobs`` and ``--sample-cache-gb`` on ``whatif``."""
    p.add_argument(
        "--jobs", type=int,
        help="K jobs over the same dataset with coordinated prep (coordl's coordinate=): each job's and the "
        "group's samples/s, the shared memory the batches hold",
    )  # fmt: skip
    p.add_argument(
        "--sample-cache-gb", type=float,
        help="a sample cache (coordl's sample_cache=) of G GB (1e9 bytes) for the deterministic prefix of prep",
    )  # fmt: skip


def remedy_error(args: argparse.Namespace, model: Model) -> str | None:
    """What is wrong with ``--jobs`` / ``--sample-cache-gb`` for this report (None: nothing)."""
    jobs, gb = args.jobs, args.sample_cache_gb
    if jobs is not None and gb is not None:
        return "--jobs and --sample-cache-gb: give one of them (their combination is not modelled)"
    if jobs is not None:
        if jobs < 1:
            return f"--jobs must be >= 1, got {jobs}"
        if not model.shared_batch_bytes:
            return f"--jobs: coordinated prep was not measured in this report: {model.coordinate_why}"
    if gb is not None:
        if not (gb >= 0 and math.isfinite(gb)):
            return f"--sample-cache-gb must be a number >= 0, got {gb}"
        if model.det_cpu_s is None or not model.cached_sample_bytes:
            return f"--sample-cache-gb: the sample cache was not measured in this report: {model.sample_cache_why}"
    return None


def remedy_ok(args: argparse.Namespace, model: Model) -> bool:
    """False (after printing the error) when ``--jobs`` / ``--sample-cache-gb`` cannot be answered."""
    error = remedy_error(args, model)
    if error is not None:
        print(f"dsanalyzer whatif: error: {error}", file=sys.stderr)
    return error is None


def _rate(p: Prediction) -> str:
    return f"{p.samples_per_s:.1f} samples/s ({p.bound}-bound)"


def print_remedy(args: argparse.Namespace, model: Model, point: stages.Point) -> float | None:
    """Print the asked remedy at ``point``; its per-job samples/s (None: no remedy was asked)."""
    if args.jobs is not None:
        k = args.jobs
        co = coordinate.coordinated(model, k, point)
        print(
            f"\ncoordinated prep, {k} job(s) (coordinate='<group>', {co.producers} producer(s): "
            f"{max(1, point.workers)} per job): each job {_rate(co.per_job)}, together "
            f"{co.aggregate_per_s:.1f} samples/s; shared memory for the batches "
            f"{format_bytes(co.memory_bytes)} ({coordinate.DEFAULT_SLOTS} slots of "
            f"{format_bytes(model.shared_batch_bytes)} + 5%); receiving a shared batch costs each job "
            f"{(model.shared_receive_s or 0) * 1e3:.2f} ms CPU"
        )
        print(
            f"uncoordinated, each of the {k} job(s) prepping every item: {_rate(co.uncoordinated)}, together "
            f"{k * co.uncoordinated.samples_per_s:.1f} samples/s"
        )
        return co.per_job.samples_per_s
    if args.sample_cache_gb is not None:
        sc = sample_cache.sample_cached(model, args.sample_cache_gb * 1e9, point)
        print(
            f"\nsample cache of {format_bytes(sc.cache_bytes)} (sample_cache=memcache.LocalStore(...)): "
            f"{sc.cached_items} of {model.dataset_items} samples ({sc.hit_ratio:.0%}) at "
            f"{format_bytes(model.cached_sample_bytes)} each, holding {format_bytes(sc.memory_bytes)}; "
            f"prep per sample: deterministic prefix {(model.det_cpu_s or 0) * 1e3:.2f} ms CPU (skipped on a hit, "
            f"read back in {(model.cache_read_s or 0) * 1e3:.3f} ms), random tail "
            f"{(model.random_cpu_s or 0) * 1e3:.2f} ms (every epoch); a hit runs {sc.random_share:.0%} of a "
            f"worker's prep"
        )
        print(
            f"with the sample cache, epoch 2 on: {_rate(sc.prediction)}, epoch {sc.prediction.epoch_s:.1f} s"
        )
        return sc.prediction.samples_per_s
    return None

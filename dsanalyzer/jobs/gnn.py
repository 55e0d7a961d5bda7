"""Profile a sampling-based GNN job: compute, sample stall, gather stall (the differential method).

A GNN step waits on two data stages instead of fetch and prep: **sampling** (CPU, walking the CSR)
and **gathering** (reading every sampled node's features: memory- and storage-bound). The runs, each
the same loader configuration, each timed at the iterator boundary (:class:`~dsanalyzer.measure.timeline.Timeline`):

``compute``   one gathered batch replayed every iteration: the step alone (T1).
``real``      the loader as given, with the step: compute + sample stall + gather stall (T4).
``sample``    the same loader with ``gather_features=False`` (zeros of the right shape for ``x``),
              with the step: compute + sample stall (T2).
``alone``     sampling and gathering without a step, one batch at a time in this process: how long
              loading takes when nothing hides it (the per-batch cost the pipeline must hide).

Then :func:`dsanalyzer.measure.stalls.differential` (the same arithmetic as the data-loader profile):
``sample_stall = max(0, T2 - T1)``, ``gather_stall = max(0, T4 - T2)``, and
``hidden_fraction = 1 - (sample_stall + gather_stall) / (sample_alone + gather_alone)``: the share of
loading time the loader overlapped with compute.

The real run goes first, so it meets the page cache as the caller left it; ``alone`` runs last, and
its gather time is measured on a page cache the real run has warmed (the report says so).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from typing import Any

from dsanalyzer.measure.stalls import bound_of, differential
from dsanalyzer.measure.timeline import RunSummary, Timeline, summarize

__all__ = ["profile_gnn", "format_gnn_report", "GNN_STALL_KEYS"]

GNN_STALL_KEYS = ("compute", "sample_stall", "gather_stall")
_RENAME = {"compute": "compute", "prep_stall": "sample_stall", "fetch_stall": "gather_stall"}


def _timed(batches: Iterable[Any], step: Callable[[Any], Any], iters: int, warmup: int) -> RunSummary:
    tl = Timeline()
    it = iter(batches)
    for _ in range(warmup + iters):
        tl.next_started()
        try:
            batch = next(it)
        except StopIteration:
            tl.abandon_pending()
            break
        tl.next_ended(len(batch))
        step(batch)
    tl.next_started()  # closes the last step
    tl.abandon_pending()
    return summarize(tl.wait_s, tl.step_s, tl.batch_items, warmup=warmup)


def _loading_alone(loader: Any, iters: int) -> dict:
    """Per-batch seconds of sampling and of gathering, one batch at a time in this process."""
    probe = loader.variant(num_workers=0, pipeline_depth=0, gather_features=False, feature_cache_bytes=0)
    try:
        sample_s, gather_s, n = 0.0, 0.0, 0
        epoch = 10_000  # an epoch the runs above did not use: other seeds, same distribution
        for b in range(min(iters, len(probe))):
            t0 = time.perf_counter()
            _seeds, blocks = probe.maker.sample(epoch, b)
            t1 = time.perf_counter()
            loader.cache.gather(blocks.input_nodes)  # the real cache: hits as in a later epoch
            t2 = time.perf_counter()
            sample_s, gather_s, n = sample_s + t1 - t0, gather_s + t2 - t1, n + 1
    finally:
        probe.close()
    return {"sample": sample_s / max(n, 1), "gather": gather_s / max(n, 1), "batches": n}


def profile_gnn(
    loader: Any,
    step: Callable[[Any], Any],
    *,
    iters: int = 30,
    warmup: int = 3,
) -> dict:
    """Split a GNN job's iteration time into compute, sample stall and gather stall.

    Args:
        loader: a :class:`coordl.graph.NeighborLoader` (anything with ``variant``, ``cache`` and
            ``maker`` like it); its configuration is what is profiled.
        step: the training step, called with one batch (forward, backward, optimizer).
        iters, warmup: batches timed per run, after ``warmup`` untimed ones; each run takes the
            first ``warmup + iters`` batches of an epoch.

    Returns:
        A report dict: ``per_iter_s`` (compute, sample_stall, gather_stall), their p10/p90 spreads,
        ``bound`` (compute, sample or gather), ``loading_alone_s``, ``hidden_fraction``, the raw
        ``runs`` and the real loader's ``loader_stats``.
    """
    one = loader.variant(num_workers=0, pipeline_depth=0, feature_cache_bytes=0)
    try:
        first = next(iter(one))
    finally:
        one.close()
    compute = _timed(itertools.repeat(first), step, iters, warmup)
    real = _timed(loader, step, iters, warmup)
    loader_stats = loader.stats()
    sample_only = loader.variant(gather_features=False, feature_cache_bytes=0)
    try:
        sample = _timed(sample_only, step, iters, warmup)
    finally:
        sample_only.close()
    alone = _loading_alone(loader, iters)
    diff = differential(compute, sample, real)
    per_iter = {_RENAME[k]: v for k, v in diff["per_iter_s"].items()}
    spread = {_RENAME[k]: v for k, v in diff["per_iter_spread_s"].items()}
    loading = alone["sample"] + alone["gather"]
    stall = per_iter["sample_stall"] + per_iter["gather_stall"]
    hidden = min(1.0, max(0.0, 1.0 - stall / loading)) if loading > 0 else 1.0
    bound = {"compute": "compute", "prep": "sample", "fetch": "gather"}[
        bound_of(
            {
                "compute": per_iter["compute"],
                "prep_stall": per_iter["sample_stall"],
                "fetch_stall": per_iter["gather_stall"],
            }
        )
    ]
    return {
        "per_iter_s": per_iter,
        "per_iter_spread_s": spread,
        "bound": bound,
        "loading_alone_s": alone,
        "hidden_fraction": hidden,
        "runs": {"compute": compute.as_dict(), "sample": sample.as_dict(), "real": real.as_dict()},
        "loader_stats": loader_stats,
        "notes": ["loading_alone_s.gather is measured after the real run, on the page cache it left"],
    }


def format_gnn_report(report: dict) -> str:
    """A few lines for a terminal."""
    p = report["per_iter_s"]
    total = sum(p[k] for k in GNN_STALL_KEYS) or 1.0
    lines = [f"per iteration: {total * 1e3:.1f} ms, bound by {report['bound']}"]
    for k in GNN_STALL_KEYS:
        lines.append(f"  {k:<13} {p[k] * 1e3:8.1f} ms  {p[k] / total:6.1%}")
    a = report["loading_alone_s"]
    lines.append(
        f"loading alone: sample {a['sample'] * 1e3:.1f} ms + gather {a['gather'] * 1e3:.1f} ms per batch; "
        f"hidden behind compute: {report['hidden_fraction']:.0%}"
    )
    return "\n".join(lines)

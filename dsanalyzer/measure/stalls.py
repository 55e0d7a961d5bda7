"""The stall arithmetic of the differential method.

With T1, T2, T4 the per-iteration times (wait + step) of the compute, prep and real runs:

    compute     = T1                 the step alone, data free
    prep stall  = max(0, T2 - T1)    what prep adds when raw data are in memory
    fetch stall = max(0, T4 - T2)    what reading storage adds on top

Each run's T is its own measured total, so no GPU time leaks into the fetch stall (a public fork of
DS-Analyzer computes ``T4 - (T2 - T1)``, which does). Differences are clipped at zero: a stage that
is fully hidden can only look negative through noise.
"""

from __future__ import annotations

import math

from dsanalyzer.measure.timeline import RunSummary

__all__ = ["differential", "bound_of", "per_epoch", "epoch_start", "STALL_KEYS"]

STALL_KEYS = ("compute", "prep_stall", "fetch_stall")


def _stall_spread(run: RunSummary, baseline_s: float) -> dict:
    it = run.spread_s.get("iter", {})
    return {q: max(0.0, float(it.get(q, math.nan)) - baseline_s) for q in ("p10", "p90")}


def differential(compute: RunSummary, prep: RunSummary, real: RunSummary) -> dict:
    """Per-iteration compute, prep stall and fetch stall (seconds) with their p10/p90 spreads."""
    t1, t2, t4 = compute.iter_s, prep.iter_s, real.iter_s
    per_iter = {"compute": t1, "prep_stall": max(0.0, t2 - t1), "fetch_stall": max(0.0, t4 - t2)}
    spread = {
        "compute": dict(compute.spread_s.get("iter", {})),
        "prep_stall": _stall_spread(prep, t1),
        "fetch_stall": _stall_spread(real, t2),
    }
    return {"per_iter_s": per_iter, "per_iter_spread_s": spread}


def bound_of(per_iter_s: dict, threshold: float = 0.05) -> str:
    """The binding resource: compute when both stalls are under ``threshold`` of an iteration,
    else the larger stall's stage."""
    total = sum(per_iter_s[k] for k in STALL_KEYS)
    prep, fetch = per_iter_s["prep_stall"], per_iter_s["fetch_stall"]
    if total <= 0 or max(prep, fetch) < threshold * total:
        return "compute"
    return "fetch" if fetch >= prep else "prep"


def per_epoch(per_iter_s: dict, items: int, batch_size: float, batches: int | None = None) -> dict:
    """Per-iteration figures scaled to one epoch: ``batches`` iterations when the loader knows its length
    (``len(loader)``: under a ``DistributedSampler`` each rank's own share), else ``items / batch_size``
    (the last batch may be partial)."""
    if batches is not None and int(batches) > 0:
        iters = int(batches)
    else:
        iters = math.ceil(items / batch_size) if batch_size > 0 else 0
    out = {k: per_iter_s[k] * iters for k in STALL_KEYS}
    out["total"] = sum(out.values())
    out["iters"] = iters
    return out


def epoch_start(wait_s: list[float], epoch_starts: list[int], warmup: int, workers: int = 1) -> dict | None:
    """What starting an epoch costs the loop beyond steady batches, from the real run's waits.

    Each of the ``w = max(1, workers)`` workers starts its first batch at once (new workers, an empty
    pipeline), so an epoch's first round of ``w`` batches arrives together: the first waits for the
    whole fill and the next ``w - 1`` hardly wait. The cost is the round's waits over ``w`` typical
    waits (the mean of the batches outside every first round: two workers on slow storage alternate
    0.64 s and 0.14 s waits, whose median is no batch's cost). Charging the first batch alone counted
    the fill that the round hands back: a 2-worker prep-bound job whose waits alternate 64 ms and 1 ms
    lost 33 ms an epoch, not the first batch's 65 ms excess (2-core Intel VM, 2026-11-28); a fetch-bound
    demo 50 ms, not 0.41 s.

    The differential stalls are per-iteration block medians, which a few slow first batches do not
    move; the observed rate is samples over the whole time, which they do (18 batches an epoch and a
    90 ms start took 13-18% of the GPU check's jobs). None when no epoch began after warm-up.
    """
    import statistics

    n = len(wait_s)
    firsts = sorted({int(i) for i in epoch_starts if warmup <= int(i) < n})
    if not firsts:
        return None
    k, first = max(1, int(workers)), set(firsts)
    rounds = []
    for f in firsts:
        end = f + 1
        while end < min(f + k, n) and end not in first:
            end += 1
        rounds.append(range(f, end))
    in_round = {i for r in rounds for i in r}
    rest = [float(wait_s[i]) for i in range(warmup, n) if i not in in_round]
    typical = statistics.fmean(rest) if rest else 0.0
    costs = [sum(float(wait_s[i]) for i in r) - len(r) * typical for r in rounds]
    return {
        "s_per_epoch": max(0.0, statistics.fmean(costs)),
        "epochs": len(firsts),
        "first_round": k,
        "first_wait_s": statistics.fmean(float(wait_s[i]) for i in firsts),
        "first_round_wait_s": statistics.fmean(sum(float(wait_s[i]) for i in r) for r in rounds),
        "typical_wait_s": typical,
        "method": "the real run: the waits of each epoch's first round (one batch per worker, from "
        "iter(loader)) minus as many waits of the other batches (their mean), warm-up dropped",
    }

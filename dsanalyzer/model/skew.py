"""What the spread of per-sample prep times costs a loader that hands out whole batches in order.

A batch is ready when its slowest part is done: its cost is the sum of its samples' prep times, and
with skewed samples (a few large or odd files) batch costs differ. torch's ``DataLoader`` gives the
batches to its workers round-robin, each worker preps its own queue of whole batches in turn, and with
``in_order=True`` (the default) the training loop takes batch k only after batch k-1, so a slow batch
holds up the ready ones behind it while the workers that finished wait for new work (at most
``prefetch_factor`` batches queued per worker). ``in_order=False`` hands out whichever batch is done first.

:func:`in_order_loss` replays that dispatch on batches drawn (seeded) from the measured per-sample prep
times, with nothing else: a training loop that takes each batch the moment it may, no loader cost. The
loss is the share of throughput in-order hand-out loses against ``in_order=False`` on the same batches
(both replays pay the same last-batch tail, which cancels). Measured on photographs with ImageNet's
spread (p99/p50 4.2x, reports/bench_skew.md): 0.2% at batch 64 with 2 workers, 1.1% with 16, 3.5% at
batch 16 with 16 workers; a batch's spread shrinks as 1/sqrt(batch), so skew binds with small batches,
many workers and heavy tails. :func:`spread_summary` is the report's ``prep_spread``.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

__all__ = ["spread_summary", "handout_seconds", "in_order_loss"]


def spread_summary(times_s: Sequence[float]) -> dict:
    """``n``, ``p50_s``, ``p90_s``, ``p99_s``, ``max_s`` and ``p99_over_p50`` of per-sample times (seconds)."""
    t = np.asarray(times_s, dtype=np.float64)
    if t.size == 0:
        raise ValueError("spread_summary: no sample times")
    p50, p90, p99 = (float(np.percentile(t, q)) for q in (50, 90, 99))
    return {
        "n": int(t.size),
        "p50_s": p50,
        "p90_s": p90,
        "p99_s": p99,
        "max_s": float(t.max()),
        "p99_over_p50": p99 / p50 if p50 > 0 else None,
    }


def handout_seconds(
    batch_s: Sequence[float], workers: int, prefetch: int = 2, in_order: bool = True
) -> float:
    """Seconds until the training loop has taken every batch (costs ``batch_s``, in sampler order).

    The first ``prefetch * workers`` batches are dispatched at once, one more each time a batch is taken.
    In order, the next batch goes to the next worker round-robin; out of order, to the next worker
    round-robin with fewer than ``prefetch`` batches queued (none such: it waits for the next take).
    """
    n = len(batch_s)
    free_at = [0.0] * workers  # when each worker has finished its queue
    queued = [0] * workers
    done_at: list[float] = []
    owner: list[int] = []
    turn = 0

    def dispatch(now: float) -> None:
        nonlocal turn
        for step in range(workers):
            w = (turn + step) % workers
            if in_order or queued[w] < prefetch:
                turn = w + 1
                break
        else:
            return
        free_at[w] = max(free_at[w], now) + float(batch_s[len(done_at)])
        done_at.append(free_at[w])
        owner.append(w)
        queued[w] += 1

    for _ in range(min(n, prefetch * workers)):
        dispatch(0.0)
    ready: list[tuple[float, int]] = []  # (done at, batch) dispatched and not taken (out of order)
    now, seen = 0.0, 0
    for taken in range(n):
        if in_order:
            k = taken
        else:
            for j in range(seen, len(done_at)):
                heapq.heappush(ready, (done_at[j], j))
            seen = len(done_at)
            k = heapq.heappop(ready)[1]
        now = max(now, done_at[k])
        queued[owner[k]] -= 1
        if len(done_at) < n:
            dispatch(now)
    return now


def in_order_loss(
    times_s: Sequence[float], batch: int, workers: int, prefetch: int = 2, batches: int = 0, seed: int = 0
) -> dict:
    """The share of throughput in-order hand-out loses to skew, replayed on batches drawn from ``times_s``.

    ``batches`` (default: 200 per worker, at least 2,000, at most 20,000: on 1,000 photographs' times
    the loss at batch 64 and 16 workers ranged 5.8-11.7% over seeds with 800 batches, 6.1-7.2% with
    10,000; about 10 ms per 1,000 batches) batches of ``batch`` samples each, drawn with
    replacement by a seeded generator. Returns ``loss`` (1 - in-order rate / out-of-order rate, 0 for
    fewer than 2 workers: one worker preps batches in order anyway), ``gain`` (out-of-order rate /
    in-order rate - 1: what ``in_order=False`` would give a prep-bound job), ``batches`` and ``seed``.
    """
    if batch < 1 or prefetch < 1:
        raise ValueError(f"in_order_loss: batch ({batch}) and prefetch ({prefetch}) must be at least 1")
    t = np.asarray(times_s, dtype=np.float64)
    if t.size == 0 or workers < 2:
        return {"loss": 0.0, "gain": 0.0, "batches": 0, "seed": seed}
    nb = batches or min(20_000, max(2_000, 200 * workers))
    drawn = np.random.default_rng(seed).choice(t, size=(nb, batch))
    costs = drawn.sum(axis=1).tolist()
    ordered = handout_seconds(costs, workers, prefetch, in_order=True)
    any_order = handout_seconds(costs, workers, prefetch, in_order=False)
    loss = max(0.0, 1.0 - any_order / ordered) if ordered > 0 else 0.0
    return {"loss": loss, "gain": loss / (1.0 - loss), "batches": nb, "seed": seed}

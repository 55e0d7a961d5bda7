"""The spread of per-sample prep times (report.json's ``prep_spread``): items at seeded random indices
over the whole dataset, each prepped once in the main process and timed by its CPU time.

The loader-alone runs give the mean prep rate; what a batch waits for is its slowest part, so the
verdict also needs the spread (:mod:`dsanalyzer.model.skew`). Each item's ``prep`` is timed with
``time.thread_time`` (CPU: waiting for a core on a loaded host, or for a cold read, is not prep) with
torch's intra-op threads at one, as in a loader worker, and torch's, NumPy's and Python's random states
restored after, so that the job's draws are unchanged. One item is prepped first untimed (a process's
first item pays imports), and an outlier is timed twice (:func:`measure_prep_spread`). Bounded: at most
``count`` items (256: the tail that drives skew is the slowest 1%) and ``budget_s`` seconds of timing.

It takes what it times as arguments (``fetch``, untimed, and ``prep``), so it imports nothing of the
loaders; :mod:`dsanalyzer.jobs.item_source` says what they are for a loader.
"""

from __future__ import annotations

import contextlib
import random
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from dsanalyzer.model.skew import spread_summary

__all__ = ["measure_prep_spread", "RETIME_OVER"]

RETIME_OVER = 3.0  # an item this many times the median is timed again (its second time kept)
RETIME_MAX = 16  # the slowest this many at most


@contextlib.contextmanager
def _as_in_a_worker() -> Iterator[None]:
    """One intra-op thread (a loader worker's), and every random state as it was on the way out."""
    torch = sys.modules.get("torch")
    py_state, np_state = random.getstate(), np.random.get_state()
    threads = torch.get_num_threads() if torch is not None else None
    fork = torch.random.fork_rng(devices=[]) if torch is not None else contextlib.nullcontext()
    try:
        with fork:
            if torch is not None:
                torch.set_num_threads(1)
            yield
    finally:
        if torch is not None and threads is not None:
            torch.set_num_threads(threads)
        random.setstate(py_state)
        np.random.set_state(np_state)


def _timed(prep: Callable[[Any, int], Any], raw: Any, index: int) -> float:
    c0 = time.thread_time()
    prep(raw, index)
    return time.thread_time() - c0


def measure_prep_spread(
    items: int,
    prep: Callable[[Any, int], Any],
    fetch: Callable[[int], Any] | None = None,
    count: int = 256,
    budget_s: float = 2.0,
    seed: int = 0,
) -> dict:
    """Per-sample prep CPU seconds of up to ``count`` items of ``items`` at seeded random indices.

    ``fetch(i)`` (untimed; None: the index itself) gives what ``prep(raw, i)`` (timed) turns into a
    sample. An item that took over :data:`RETIME_OVER` times the median is prepped again and its second
    time kept (``retimed`` counts them): a one-off cost (a decoder's first use in the process, a
    collection) would otherwise pass for skew, and one such outlier in 1,000 photographs read as a 26%
    in-order loss at batch 16 and 16 workers where the items' own times give 4-5%. Returns
    :func:`~dsanalyzer.model.skew.spread_summary`'s fields, ``cpu_s`` (each item's seconds, in the order
    timed), ``retimed``, ``seed`` and ``seconds`` (the probe's wall time); ``{"error": ...}`` when the
    dataset has no items or an item fails.
    """
    if items < 1:
        return {"error": "the dataset has no items"}
    t0 = time.perf_counter()
    take = min(items, count + 1)
    order = np.random.default_rng(seed).choice(items, size=take, replace=False).tolist()
    get = fetch if fetch is not None else (lambda i: i)
    cpu: list[float] = []
    at = order[0]
    try:
        with _as_in_a_worker():
            prep(get(at), at)  # warm: the first item pays imports
            for at in order[1:] or order:
                cpu.append(_timed(prep, get(at), at))
                if time.perf_counter() - t0 > budget_s:
                    break
            over = RETIME_OVER * float(np.median(cpu))
            slow = sorted((k for k, t in enumerate(cpu) if t > over), key=lambda k: -cpu[k])[:RETIME_MAX]
            for n, k in enumerate(slow):
                if time.perf_counter() - t0 > 2 * budget_s:  # a dataset of slow items: keep the bound
                    slow = slow[:n]
                    break
                at = (order[1:] or order)[k]
                cpu[k] = _timed(prep, get(at), at)
    except Exception as e:  # noqa: BLE001 - any dataset's item may fail: the profile goes on without it
        line = (str(e).strip().splitlines() or [""])[0]
        return {"error": f"item {at} failed: {type(e).__name__}: {line}"}
    out = spread_summary(cpu)
    out.update({"cpu_s": cpu, "retimed": len(slow), "seed": seed, "seconds": time.perf_counter() - t0})
    return out

"""Overhead of dsanalyzer's per-iteration timeline on the step it measures.

    .venv/bin/python benchmarks/bench_dsanalyzer_overhead.py [--iters 2000] [--repeats 7]

The same loop runs plain (what a user runs without a profiler) and through dsanalyzer's timed
iterator (the exact object the import hook hands the script: Timeline + stop counter + progress
file), alternately, several times; the table shows medians and their ratio. Batches come from a
list in memory, so the loop is all step and no wait: the worst case for a relative overhead.
Steps: an empty step (the per-iteration cost in microseconds) and CPU steps of 1 ms and 10 ms
(spins), shorter than most real training steps, which only makes the ratio larger.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from dsanalyzer.intercept import ProbeState, TimedIterator
from dsanalyzer.measure.hookconfig import HookConfig


def _step(step_s: float):
    """A CPU step of a set duration (a spin: the same work in both loops)."""

    def step(batch: object) -> None:
        deadline = time.perf_counter() + step_s
        while time.perf_counter() < deadline:
            pass

    return step


def _loop(iterator, step, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        step(next(iterator))
    return time.perf_counter() - t0


def _timed(batches: list, n: int, result_dir: str):
    state = ProbeState(HookConfig("real", result_dir=result_dir, iters=n + 10, warmup=0))
    state.loader = object()  # what the hook records on the first __iter__
    return TimedIterator(iter(batches), state)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    torch.set_num_threads(1)
    batches = [torch.zeros(32, 3)] * (args.iters + 20)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, step_s, n in (
            ("empty step", 0.0, args.iters * 10),
            ("1 ms step", 1e-3, args.iters),
            ("10 ms step", 1e-2, args.iters // 10),
        ):
            step = _step(step_s)
            _loop(iter(batches), step, min(n, 50))  # warm up
            plain, timed = [], []
            for _ in range(args.repeats):
                plain.append(_loop(iter(batches * (n // len(batches) + 1)), step, n) / n)
                timed.append(_loop(_timed(batches * (n // len(batches) + 1), n, tmp), step, n) / n)
            mp, mt = statistics.median(plain), statistics.median(timed)
            rows.append((label, mp, mt, mt - mp, mt / mp))
    print(f"{'loop':<14} {'plain s/iter':>14} {'timed s/iter':>14} {'added us/iter':>14} {'timed/plain':>12}")
    for label, mp, mt, diff, ratio in rows:
        print(f"{label:<14} {mp:>14.3e} {mt:>14.3e} {diff * 1e6:>14.2f} {ratio:>12.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

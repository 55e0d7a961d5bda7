"""Measure the accuracy gap behind ``checks.topk_ef_accuracy_close_to_dense`` over many seeds (not a test).

    python -m tests.gradcomp.measure_ef_margin --seeds 20

For each seed it trains the check's MLP on 2 gloo ranks dense, top-1% with error feedback and top-1% without,
and prints each gap to dense plus mean / min / standard deviation, and the distribution of the mean over
``len(checks.EF_SEEDS)`` seeds that the check compares with its margin. The results below are what
``checks.EF_MARGIN`` rests on: measure again and update them when the model, the steps or the margin change.

Measured 2026-11-23 on a 2-core Xeon (AVX-512), torch 2.13.0 CPU, 500 steps, seeds 0-19:

- top-1% + EF minus dense: mean -0.0025, min -0.0120, max +0.0080, sd 0.0055;
- mean over 4 seeds: sd about 0.0055 / 2 = 0.0028; the 17 windows of 4 consecutive seeds ranged -0.0053..+0.0015;
- seed 0 alone under six ATEN_CPU_CAPABILITY / MKL_CBWR settings (other CPUs' kernels): EF 0.7910-0.7945 against
  dense 0.8030 every time, i.e. gaps -0.0120..-0.0085: inside the seed-to-seed spread above.

So ``EF_MARGIN = 0.015`` on the mean of 4 seeds lies (0.015 - 0.0025) / 0.0028 = 4.5 standard deviations below
the measured mean (a false failure about 1 in 300,000 runs if the mean is normal), while a compressor or memory
that breaks convergence (accuracy far from the 0.80 plateau) still fails it.

Top-1% *without* error feedback is no worse on this easy task (mean +0.0041 at 500 steps, +0.006 at 200), so
the check pins down convergence with top-1% + EF, not that EF is needed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from tests.gradcomp import checks
from tests.gradcomp.dist_util import run_ranks


def _record(rank: int, world: int, seeds: list[int], steps: int, out: str) -> None:
    rows = []
    for seed in seeds:
        row = {"seed": seed, "dense": checks.accuracy_after(rank, None, seed, steps)}
        row["ef"] = checks.accuracy_after(rank, checks.TOPK_EF, seed, steps)
        row["no_ef"] = checks.accuracy_after(rank, checks.TOPK_NO_EF, seed, steps)
        rows.append(row)
        if rank == 0:
            print(json.dumps(row), flush=True)
    if rank == 0:
        Path(out).write_text(json.dumps(rows))


def _describe(name: str, gaps: list[float]) -> str:
    return (
        f"{name}: mean {statistics.fmean(gaps):+.4f}, min {min(gaps):+.4f}, max {max(gaps):+.4f}, "
        f"sd {statistics.stdev(gaps):.4f} over {len(gaps)} seeds"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20, help="seeds 0 .. N-1")
    parser.add_argument("--steps", type=int, default=checks.EF_STEPS, help="training steps per run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "rows.json")
        run_ranks(_record, 2, list(range(args.seeds)), args.steps, out)
        rows = json.loads(Path(out).read_text())
    ef = [r["ef"] - r["dense"] for r in rows]
    no_ef = [r["no_ef"] - r["dense"] for r in rows]
    print(_describe("top-1% + EF minus dense", ef))
    print(_describe("top-1% without EF minus dense", no_ef))
    m = len(checks.EF_SEEDS)
    # Every window of m consecutive seeds: what the check's mean can come out as for other seed choices.
    windows = [statistics.fmean(ef[i : i + m]) for i in range(len(ef) - m + 1)]
    print(f"mean of {m} consecutive seeds (EF): min {min(windows):+.4f}, max {max(windows):+.4f}")
    windows = [statistics.fmean(no_ef[i : i + m]) for i in range(len(no_ef) - m + 1)]
    print(f"mean of {m} consecutive seeds (no EF): min {min(windows):+.4f}, max {max(windows):+.4f}")


if __name__ == "__main__":
    main()

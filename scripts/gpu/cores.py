"""The what-if's cores axis past 2 cores: a plain torch job profiled on 2 cores, predicted and run on 4, 8, 16.

``dsanalyzer whatif --cpus`` was validated at 1 -> 2 cores only (the development VM has two), while its
verdict extrapolates to a server's 16. This is the plain-torch family of
``benchmarks/bench_whatif_accuracy.py`` (``benchmarks/whatif_plain_jobs.py``: an unmodified training
script over a plain ``torch.utils.data.DataLoader`` whose ``Dataset`` decodes JPEGs with Pillow, a small
CNN step on the CPU, torch's default intra-op threads) run as a program: ``dsanalyzer profile`` of the
job confined to the first 2 cores, the what-if (``Model.predict(cpus=N, workers=w)``, what ``dsanalyzer
whatif --cpus N --workers w`` computes) at N = 4, 8, 16, and the same script run ``RUNS`` times on the
first N cores (median). Each job has one worker per core but one (``--spare-cores 1``): the main
process keeps a core for its step, and more cores mean more prep.

The job is made prep-bound by its images (800x600 JPEGs, about 6 ms of CPU each to decode and resize on
the VM), and its epochs long by hard links: ``UNIQUE`` images, each listed ``COPIES`` times (the decode
cost is the file's, the bytes sit in the page cache as the what-if's steady state has them; generating
1,920 such images would take longer than the measurement). A run times whole epochs (``--measure-per-
core`` batches per core: 1, 2 and 4 epochs at 4, 8 and 16 cores), so every run counts its epochs'
starts (new workers, an empty pipeline) as the what-if charges them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from gpu.common import Context, SectionError, SectionTimeout, Skip, fmt

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from plainstore import link_copies  # noqa: E402

TITLE = "dsanalyzer whatif: the cores axis past 2 cores (a plain torch job, 2 -> 4, 8, 16)"
BUDGET_S = 170
CASE = "pillow w2 b16"  # the benchmark's Pillow Dataset job, batch 16 (its worker count: cores - 1 here)
BATCH = 16
# 2 runs of ~6 s timed at each count (the first H200 run, 3 runs of 10 s, reached 4 cores of 4, 8, 16 in 150 s)
PROFILE_CPUS, RUN_CPUS, RUNS = 2, (4, 8, 16), 2
UNIQUE, COPIES, SIZE, ITERS = 192, 6, (800, 600), 30
DRY_PROFILE_CPUS, DRY_RUN_CPUS, DRY_RUNS = 1, (2,), 1
DRY_UNIQUE, DRY_COPIES, DRY_SIZE, DRY_ITERS = 24, 4, (200, 150), 4


def measure_per_core(items: int, batch: int, first_count: int) -> int:
    """Batches timed per core so that a run on ``first_count`` cores times one whole epoch (more cores: more
    epochs); at least 1."""
    per_epoch = -(-items // batch)
    return max(1, per_epoch // first_count)


def counts_here(profile: int, runs: tuple[int, ...], cores: int) -> tuple[int, list[int]]:
    """The core counts this machine has: the profile's (or fewer) and the run counts above it that fit."""
    if cores < 2:
        raise Skip(f"this machine lets the check run on {cores} core: it needs 2 (profile on 1, run on 2)")
    profile = min(profile, cores - 1)
    fit = [n for n in runs if profile < n <= cores]
    return profile, fit or [cores]


def _error(row: dict) -> tuple[str, str]:
    err = row.get("error")
    if not isinstance(err, float):
        return "-", "-"
    return f"{err:+.1%}", "yes" if abs(err) <= 0.10 else "NO"


def _table(ctx: Context, rows: list[dict], profile: int, counts: list[int], workers0: int) -> None:
    body = []
    for r in rows:
        runs = r.get("measured_all") or []
        err, ok = _error(r)
        share = [b for _, b in r.get("shares") or []]
        body.append([r["cpus"], r["workers"], fmt(r.get("predicted")), "/".join(r.get("predicted_bounds") or []) or "-",
                     fmt(r.get("measured")), f"{fmt(min(runs))}-{fmt(max(runs))}" if runs else "-",
                     f"{share[0]:.2f}" if share else "-", err, ok])  # fmt: skip
    done = {r["cpus"] for r in rows}
    left = [n for n in counts if n not in done]
    ctx.table(
        f"whatif --cpus N on a profile under {profile} core(s) ({workers0} worker(s)) vs the job run on the first N "
        f"cores: {CASE.split()[0]} Dataset, batch {BATCH}, workers = cores - 1",
        ["cores", "workers", "predicted/s", "predicted bound", "measured/s (median)", "runs' range", "run's core share",
         "error (pred-meas)/meas", "within 10%"],
        body,
        note=f"not measured (out of time): {left} cores" if left else "",
    )  # fmt: skip


def run(ctx: Context) -> None:
    import psutil

    import coordl

    dry = ctx.dry
    profile, runs_at, n_runs = (
        (DRY_PROFILE_CPUS, DRY_RUN_CPUS, DRY_RUNS) if dry else (PROFILE_CPUS, RUN_CPUS, RUNS)
    )
    unique, copies, (w, h), iters = (DRY_UNIQUE, DRY_COPIES, DRY_SIZE, DRY_ITERS) if dry else (UNIQUE, COPIES, SIZE, ITERS)  # fmt: skip
    cores = len(os.sched_getaffinity(0))
    profile, counts = counts_here(profile, runs_at, cores)
    if counts != [n for n in runs_at if n > profile]:
        ctx.note(
            f"This machine lets the check use {cores} cores: measured at {counts} instead of {list(runs_at)}."
        )
    ctx.note(f"Machine: {cores} cores usable ({psutil.cpu_count(logical=False)} physical, "
             f"{psutil.cpu_count()} logical). The run on all {cores} cores shares them with the job's main process "
             "(one core's worth: workers = cores - 1), the benchmark driver and this check (both waiting).")  # fmt: skip
    src = coordl.synth.make_dataset(ctx.work / "unique", unique, 8, width=w, height=h)
    data = link_copies(src, copies)
    items = sum(1 for _ in data.glob("class_*/*.jpg"))
    per_core = measure_per_core(items, BATCH, counts[0])
    ctx.command(
        f"coordl.synth.make_dataset(unique, {unique}, 8, width={w}, height={h}); {copies} hard links each"
    )
    argv = [sys.executable, "benchmarks/bench_whatif_accuracy.py", "--family", "plain", "--cases", CASE,
            "--data", str(data), "--work", str(ctx.work / "bench"), "--rounds", "1",
            "--iters", str(iters), "--cpus", str(profile), *map(str, counts), "--spare-cores", "1",
            "--runs", str(n_runs), "--measure-per-core", str(per_core), "--as-written-only"]  # fmt: skip
    rows_path = ctx.work / "bench" / "rows.json"
    try:
        ctx.run(argv, timeout=ctx.remaining() - 4, check=False)
    except SectionTimeout:
        rows = json.loads(rows_path.read_text()) if rows_path.exists() else []
        _table(ctx, rows, profile, counts, max(1, profile - 1))
        raise
    tail = "\n".join(ctx.last_output.strip().splitlines()[-15:])
    if not rows_path.exists():
        raise SectionError(f"the benchmark wrote no {rows_path}:\n{tail}")
    rows = json.loads(rows_path.read_text())
    _table(ctx, rows, profile, counts, max(1, profile - 1))
    if "Traceback" in ctx.last_output:  # it failed part way (its exit code 1 alone means a target missed)
        raise SectionError(f"the benchmark failed after {len(rows)} of {len(counts)} core counts:\n{tail}")
    for line in ctx.last_output.splitlines():
        if " round 1: " in line:
            ctx.note(line.strip())
    ctx.note(f"{items} images ({unique} distinct {w}x{h} JPEGs, {copies} hard links each, in the page cache); "
             f"each run times {per_core} batches per core (whole epochs: {items // BATCH} batches each) after 10.")  # fmt: skip

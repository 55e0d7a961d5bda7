"""The loader at the decode limit on the GPU host's 16 cores, through benchmarks/bench_loader.py.

Every loader-at-the-limit figure so far comes from a 2-core host, where torch's worker protocol and the
main process take a large share of the cores; users run 8-15 workers on 16-64 cores. This section runs
bench_loader's prep-bound table (its own children, alternation and medians) there with 15 and with 8
workers: ``coordl.DataLoader`` with persistent workers (h), torch's DataLoader + simplejpeg (b) and DALI's
CPU pipeline (c, skipped with the reason where DALI is not importable), each right after the crop-decode
limit measured as N tight decode+augment loops (bench_loader's ``--child limit``; N = the workers).

The claim is about prep, so nothing is throttled: ``--no-slowstore`` keeps the dataset in its plain folder
(slowstore's loop device needs root and cgroup v1, which a GPU host may lack) and ``--cache-fraction 1``
makes every loader fully cached (coordl in its own cache, the others in the page cache). The main process's CPU per batch
and share of a core come from bench_loader's per-process split (``getrusage`` of the child, epochs 2..).
Target: (h) >= 95% of the limit.
"""

from __future__ import annotations

import json
import os
import sys
import time

from gpu.common import ROOT, Context, SectionError, fmt, median

TITLE = "The loader at the decode limit: bench_loader's prep-bound table with 15 and 8 workers"
BUDGET_S = 125
BENCH = "benchmarks/bench_loader.py"
CONFIGS = "bch"  # bench_loader's letters: the peers and coordl with persistent workers
NAMES = {
    "b": "torch DataLoader + simplejpeg",
    "c": "DALI CPU pipeline",
    "h": "coordl.DataLoader, persistent_workers=True",
}
TARGET = "h"
# An epoch must hold many batches per worker, or its start and end (workers filling, the last batches
# draining; the limit's loops have neither) weigh on the rate: at 15 workers a batch of 16 takes ~25 ms,
# so the timed epoch should last a second or more. Making images costs ~30/s a core, so the epoch is made
# of hardlinked copies (bench_loader --replicate), as many as the transform's speed here needs.
# epochs 2: the first fills coordl's cache and the page cache, the second is timed.
REAL = {"n": 1500, "batch": 16, "epochs": 2, "runs": 2, "epoch_s": 1.0, "max_copies": 12}
DRY = {"n": 64, "batch": 8, "epochs": 2, "runs": 1, "epoch_s": 0.2, "max_copies": 2}
CLASSES = 4


def worker_counts(cores: int, dry: bool) -> tuple[list[int], str]:
    """The worker counts to measure (most first: the claim users buy) and a note when scaled down."""
    if dry:  # one count: the wiring (two runs of the same code took CI's parallel phase 40 s)
        return [min(2, cores)], ""
    if cores >= 16:
        return [15, 8], ""
    counts = sorted({max(1, cores - 1), max(1, cores // 2)}, reverse=True)
    return (
        counts,
        f"This host has {cores} cores, not 16: measured with {' and '.join(map(str, counts))} workers.",
    )


def copies_for(sample_s: float, workers: int, n: int, epoch_s: float, max_copies: int) -> int:
    """Copies of each of ``n`` images for an epoch of about ``epoch_s`` at ``workers`` x one loop's rate."""
    return max(1, min(max_copies, round(epoch_s * workers / max(sample_s, 1e-6) / n)))


def _sample_seconds(root) -> float:
    """The recipe's CPU seconds per sample in this process (one thread), over 40 of the images."""
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import prep_recipes  # the benchmark's recipes (benchmarks/ is no package)

    torch.set_num_threads(1)
    raws = [f.read_bytes() for f in sorted(root.glob("class_*/*.jpg"))[:40]]
    tf = prep_recipes.make_transform("standard")
    for raw in raws[:5]:
        tf(raw)
    t = time.process_time()
    for raw in raws:
        tf(raw)
    return (time.process_time() - t) / len(raws)


def rows(prep: dict, batch: int) -> list[list[str]]:
    """The table's rows from one bench_loader run's ``prep[recipe]``: the limit, then each loader with
    the median of its runs' ratio to the limit measured right before it, and its main process's cost."""
    lim = prep["limit"]
    out = [["limit: N tight loops", fmt(median([r[0] for r in lim]), 0), "1.00", "", fmt(median([r[1] for r in lim]) * 1e3, 2),
            fmt(median([r[0] * r[1] for r in lim]), 2), "-", "-"]]  # fmt: skip
    for cfg in CONFIGS:
        runs = prep.get(cfg)
        if not runs:
            continue
        vs = median([r["rate"] / r["limit_rate"] for r in runs])
        target = ("yes" if vs >= 0.95 else "NO") if cfg == TARGET else ""
        main_ms = median([r["main_cpu_s"] for r in runs]) * 1e3
        share = median([r["rate"] * r["main_cpu_s"] for r in runs])
        out.append([f"({cfg}) {NAMES[cfg]}", fmt(median([r["rate"] for r in runs]), 0), fmt(vs, 2), target,
                    fmt(median([r["cpu_s"] for r in runs]) * 1e3, 2), fmt(median([r["rate"] * r["cpu_s"] for r in runs]), 2),
                    fmt(main_ms * batch, 2), fmt(share, 2)])  # fmt: skip
    return out


def edge_note(prep: dict, workers: int, items: int, batch: int) -> str:
    """What an epoch's edges cost every loader here and not the limit: the first batch takes one worker a
    batch's prep before anything arrives (and the last ones drain with workers idle), against the timed
    epoch at the limit's rate. A training epoch of a real dataset is thousands of times longer."""
    rate, cpu = median([r[0] for r in prep["limit"]]), median([r[1] for r in prep["limit"]])
    first, epoch = batch * cpu, items / rate
    return (
        f"{workers} worker{'s' * (workers > 1)}, epoch edges: a batch's prep takes one worker {first * 1e3:.0f} ms, "
        f"{first / epoch:.1%} of the timed epoch at the limit's rate ({epoch:.2f} s): about what every loader "
        "loses per epoch here to its start and end and the limit does not."
    )


def _bench(ctx: Context, workers: int, size: dict, copies: int, runs: int, timeout: float) -> dict:
    out = ctx.work / f"prep-{workers}.json"
    argv = [sys.executable, BENCH, "--no-slowstore", "--skip-fetch-bound", "--skip-cpu-table",
            "--prep-configs", CONFIGS, "--recipes", "standard", "--cache-fraction", "1",
            "--workers", str(workers), "--limit-procs", str(workers), "--n", str(size["n"]),
            "--classes", str(CLASSES), "--replicate", str(copies), "--batch-size", str(size["batch"]),
            "--epochs", str(size["epochs"]), "--runs", str(runs), "--data-dir", str(ctx.work / "data"),
            "--json", str(out)]  # fmt: skip
    ctx.run(argv, timeout=timeout)
    return json.loads(out.read_text())["prep"]["standard"]


ROWS = 64  # a loop's output rows in the limit with a loader's working set: 4 batches of 16, a worker's slots


def _working_set_limit(ctx: Context, workers: int, size: dict, copies: int) -> tuple[float, ...]:
    """decode_limit with ``rows``: each loop over its share of every item, each output into its own row."""
    name = f"synth-{size['n']}-{CLASSES}" + (f"-x{copies}" if copies > 1 else "")
    root = ctx.work / "data" / name
    code = ("import json, sys; sys.path.insert(0, 'benchmarks'); from decode_limit import decode_limit; "
            f"print(json.dumps(decode_limit({str(root)!r}, {workers}, 600, 'standard', rows={ROWS})))")  # fmt: skip
    out = ctx.run([sys.executable, "-c", code], timeout=max(10.0, min(60.0, ctx.remaining() - 5)))
    return tuple(json.loads(out.strip().splitlines()[-1]))


def working_set_row(limit: tuple[float, ...], prep: dict) -> tuple[list[str], str]:
    """The table row of the limit with a loader's working set, and a note with coordl's ratio to it."""
    hot = median([r[0] for r in prep["limit"]])
    row = [f"limit, a loader's working set ({ROWS} output rows a loop, every item)", fmt(limit[0], 0),
           fmt(limit[0] / hot, 2), "", fmt(limit[1] * 1e3, 2), fmt(limit[0] * limit[1], 2), "-", "-"]  # fmt: skip
    runs = prep.get(TARGET) or []
    coordl = median([r["rate"] for r in runs]) if runs else None
    note = (
        f"Against the limit with a loader's working set ({fmt(limit[0], 0)} samples/s, measured once after the "
        f"runs), ({TARGET}) reaches {fmt(coordl / limit[0], 2)}: what remains is the loader's own cost."
        if coordl
        else ""
    )
    return row, note


def _decoder() -> str:
    from coordl.prep import cropdecode

    if cropdecode.AVAILABLE:
        return "coordl's crop decoder (coordl.prep._cropjpeg: only the crop's blocks are decoded)"
    return (
        "whole-image decodes (coordl.prep._cropjpeg is not built here; simplejpeg decodes every image whole)"
    )


def _dali_missing() -> str:
    try:
        import nvidia.dali.plugin.pytorch  # noqa: F401
    except ImportError as e:
        return str(e)
    return ""


def _copies(ctx: Context, size: dict, workers: int) -> int:
    """Make the images (bench_loader finds them made: same folder, same parameters), time the recipe on
    them, and size the epoch; no more copies than half of /dev/shm's free space holds in coordl's cache."""
    import shutil

    from coordl.datasets import synth

    n = size["n"]
    ctx.command(f"coordl.datasets.synth.make_dataset(data/synth-{n}-{CLASSES}, n={n}, classes={CLASSES})")
    root = synth.make_dataset(ctx.work / "data" / f"synth-{n}-{CLASSES}", n=n, classes=CLASSES)
    sample_s = _sample_seconds(root)
    per_copy = sum(f.stat().st_size for f in root.glob("class_*/*.jpg"))
    shm = shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else 0
    most = max(1, min(size["max_copies"], int(shm / 2 / per_copy)))
    copies = copies_for(sample_s, workers, n, size["epoch_s"], most)
    ctx.note(
        f"Epoch: {n} images x {copies} hardlinked copies = {n * copies} items, {per_copy * copies / 1e6:.0f} MB in "
        f"coordl's cache; sized from the recipe's {sample_s * 1e3:.2f} ms/sample in one process here, for "
        f"~{size['epoch_s']:g} s at {workers} workers (/dev/shm free: {shm / 2**30:.1f} GiB)."
    )
    return copies


def run(ctx: Context) -> None:
    size = DRY if ctx.dry else REAL
    counts, scaled = worker_counts(os.cpu_count() or 1, ctx.dry)
    if scaled:
        ctx.note(scaled)
    ctx.note(f"Decoder of the limit and of every loader (same recipe, same interpreter): {_decoder()}.")
    copies = _copies(ctx, size, counts[0])
    header = ["loader", "samples/s", "vs limit", ">= 95%", "CPU ms/sample", "cores", "main CPU ms/batch",
              "main: cores"]  # fmt: skip
    took, runs = 0.0, size["runs"]
    for i, workers in enumerate(counts):
        # fewer workers take longer (measured here: 1.4x at 1 vs 2 workers); short of time, one run, not a timeout
        if i and runs > 1 and ctx.remaining() < 1.4 * took:
            runs = 1
            ctx.note(
                f"{workers} workers: 1 run, not {size['runs']}: {ctx.remaining():.0f} s left of the budget."
            )
        t0 = time.monotonic()
        prep = _bench(ctx, workers, size, copies, runs, ctx.share(0.6) if i == 0 else ctx.remaining())
        took = time.monotonic() - t0
        table = rows(prep, size["batch"])
        ws_note = ""
        try:
            ws_row, ws_note = working_set_row(_working_set_limit(ctx, workers, size, copies), prep)
            table.insert(1, ws_row)
        except SectionError as e:  # the plain table still stands
            ws_note = f"The limit with a loader's working set did not run: {str(e).splitlines()[0]}"
        timed = "epoch 2" if size["epochs"] == 2 else f"epochs 2-{size['epochs']}"
        ctx.table(
            f"{workers} worker{'s' * (workers > 1)} vs the limit of {workers} tight loop{'s' * (workers > 1)}: "
            f"{size['n'] * copies} items (500x375 JPEGs), batch {size['batch']}, fully cached, {timed}, "
            f"medians of {runs} run{'s' * (runs > 1)}",
            header,
            table,
            note="'vs limit': median of each run's rate over the limit measured right before it. 'cores': "
            "CPU s/sample x samples/s (every process of the loader). 'main CPU ms/batch' and 'main: cores': "
            "the main process's CPU time per batch and its share of a core while the loader runs (DALI's "
            "threads run in the main process: all its CPU is there); the limit's loops have no main process.",
        )
        ctx.note(edge_note(prep, workers, size["n"] * copies, size["batch"]))
        if ws_note:
            ctx.note(ws_note)
        if i == 0 and "c" not in prep:
            ctx.note(f"(c) DALI CPU skipped: nvidia.dali is not importable here ({_dali_missing() or '?'}).")

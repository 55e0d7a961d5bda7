"""``DALILoader(device="gpu")`` against DALI's own file reader, through benchmarks/bench_dali.py.

Runs of the benchmark (its own child processes, its own tables' method): prep-bound and fully cached
(target: DALILoader >= 95% of DALI alone's samples/s; every image hardlinked 12 times, so that an
epoch lasts about a second: with nvJPEG an epoch of 1,000 images took 0.07 s, and the first H200 run
measured mostly epoch starts), two jobs at once (DALI alone side by side vs a coordinated DALILoader
pair: storage reads per item), and fetch-bound on throttled storage with the MinIO cache at 50%
(target: at the bytes bound). The fetch-bound part needs what ``benchmarks/slowstore.py``
needs (root, cgroup v1 memory and blkio, loop devices); where those are missing it is skipped with the
reason. Without NVIDIA DALI the whole section is skipped: its CUDA wheel is far larger than a device
call carries, so it travels in parts over consecutive calls (``scripts/gpu_dali.sh``; docs/gpu.md).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from gpu.common import Context, Skip, fmt, median, ratio

TITLE = "DALI on the GPU: DALILoader vs DALI's file reader"
BUDGET_S = 180
BENCH = "benchmarks/bench_dali.py"
THREADS = min(16, os.cpu_count() or 1)  # DALI's CPU threads and coordl's workers (the 16)
NAMES = {"dali": "DALI alone (fn.readers.file)", "dali_loader": "coordl.dali.DALILoader",
         "coordl": "coordl.DataLoader (CPU prep)"}  # fmt: skip
WHEEL_NOTE = ("nvidia-dali-cuda130's wheel is 199 MB (with nvimgcodec and nvjpeg 228 MB), over the 64 MiB a "
              "device call carries: scripts/gpu_dali.sh packs it in parts for consecutive calls (docs/gpu.md)")  # fmt: skip


def slowstore_missing() -> str:
    """Why benchmarks/slowstore.py cannot run here ('' when it can)."""
    if os.geteuid() != 0:
        return "not root"
    if not Path("/dev/loop-control").exists():
        return "no loop devices (/dev/loop-control)"
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from slowstore import cgroup_missing

    return cgroup_missing()


def _bench(ctx: Context, extra: list[str], name: str, timeout: float) -> dict:
    out = ctx.work / f"{name}.json"
    device = "gpu" if ctx.device == "cuda" else "cpu"
    argv = [sys.executable, BENCH, "--device", device, "--prep-configs", "dali,dali_loader",
            "--fetch-configs", "dali,dali_loader", "--data-dir", str(ctx.work / "data"),
            "--workers", str(THREADS if not ctx.dry else 1), "--json", str(out), *extra]  # fmt: skip
    ctx.run(argv, timeout=timeout)
    return json.loads(out.read_text())


def _prep_table(ctx: Context, prep: dict, runs: int) -> None:
    prep = prep.get(
        "synth", prep
    )  # bench_dali keys part (1) by dataset since --photos (this check: synthetic)
    base = median([r["rate"] for r in prep["dali"]])
    rows = []
    for cfg, results in prep.items():
        rate = median([r["rate"] for r in results])
        vs = ratio(rate, base)
        target = "" if cfg != "dali_loader" else ("yes" if vs is not None and vs >= 0.95 else "NO")
        rows.append(
            [NAMES[cfg], fmt(rate, 0), fmt(vs, 2), fmt(median([r["cpu_ms"] for r in results]), 2), target]
        )
    ctx.table(f"Prep-bound, fully cached: train_pipeline(224) on the {ctx.device} ({THREADS if not ctx.dry else 1} "
              f"CPU threads), medians of {runs} runs",
              ["loader", "samples/s", "vs DALI alone", "CPU ms/sample", ">= 95%"], rows)  # fmt: skip


def _pair_table(ctx: Context, pairs: dict, runs: int) -> None:
    rows = []
    for cfg, results in pairs.items():
        rows.append([f"2 x {NAMES[cfg]}", fmt(median([r["rate"] for r in results]), 0),
                     fmt(median([r["read_per_item"] for r in results]), 2),
                     fmt(median([r["cpu_ms"] for r in results]), 2)])  # fmt: skip
    ctx.table(f"Two jobs at once, page-cached files, each prepping on the {ctx.device}: DALI alone side by side vs "
              f"DALILoader(coordinate=...), medians of {runs} runs",
              ["pair", "samples/s together", "storage reads per item", "CPU ms/sample"], rows,
              note="A coordinated pair fetches each batch's raw bytes once for both jobs (0.5 reads per item, "
                   "plus what its producers fetched ahead); each job still decodes every batch itself.")  # fmt: skip


def _fetch_table(ctx: Context, fetch: dict, mb_s: float) -> None:
    rows = []
    for cfg, runs in fetch.items():
        for e in range(len(runs[0])):
            epochs = [r[e] for r in runs]
            rate = median([x["items"] / x["time_s"] for x in epochs])
            bound = median([x["bound"] for x in epochs])
            rows.append([NAMES[cfg], e + 1, fmt(rate, 0), fmt(median([x["disk_bytes"] / 1e6 for x in epochs])),
                         fmt(bound, 0), fmt(ratio(rate, bound), 2)])  # fmt: skip
    ctx.table(f"Fetch-bound: {mb_s:g} MB/s storage, MinIO cache (DALILoader) or page cache (DALI) at 50%",
              ["loader", "epoch", "samples/s", "storage MB", "bytes bound samples/s", "rate / bound"], rows)  # fmt: skip


def run(ctx: Context) -> None:
    try:
        import nvidia.dali  # noqa: F401
    except ImportError as e:
        raise Skip(f"NVIDIA DALI is not importable ({e}): {WHEEL_NOTE}") from None
    n, runs = (60, 1) if ctx.dry else (1000, 3)
    size = [
        "--n",
        str(n),
        "--classes",
        "4",
        "--epochs",
        "2" if ctx.dry else "3",
        "--batch-size",
        "16" if ctx.dry else "64",
        "--replicate",
        "1" if ctx.dry else "12",
    ]
    prep = _bench(
        ctx, size + ["--runs", str(runs), "--skip-fetch-bound", "--coordinated"], "prep", ctx.share(0.72)
    )
    _prep_table(ctx, prep["prep"], runs)
    _pair_table(ctx, prep["coordinated"], runs)
    missing = slowstore_missing()
    if ctx.dry:
        ctx.note(
            "Fetch-bound part not run in a dry run (it throttles a loop device; needs root and cgroup v1)."
        )
    elif missing:
        ctx.note(f"Fetch-bound part skipped: benchmarks/slowstore.py cannot run here ({missing}).")
    else:
        mb_s = 32.0
        fetch = _bench(ctx, ["--n", "600", "--runs", "1", "--batch-size", "64", "--skip-prep-bound", "--read-mb-s", f"{mb_s:g}"],
                       "fetch", ctx.share(0.25))  # fmt: skip
        _fetch_table(ctx, fetch["fetch"], mb_s)

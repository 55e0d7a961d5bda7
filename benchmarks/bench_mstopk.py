"""MSTopK vs torch.topk vs a full sort: time and recall, 1M-100M elements, density 0.001-0.01, CPU and CUDA.

    .venv/bin/python benchmarks/bench_mstopk.py                  # CPU (and CUDA when available)
    .venv/bin/python benchmarks/bench_mstopk.py --sizes 1e6,1e7 --reps 5 --devices cpu

Prints one table per device: median milliseconds of ``reps`` runs (after one warm-up) and MSTopK's recall of the
exact top-k, with the ratio torch.topk time / MSTopK time (> 1: MSTopK is faster).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from gradcomp.mstopk import mstopk, recall, topk


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn, device: torch.device, reps: int) -> float:
    fn()
    _sync(device)
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def _sort_topk(x: torch.Tensor, k: int) -> torch.Tensor:
    return torch.sort(x.abs(), descending=True).indices[:k]


def bench(
    device: torch.device, sizes: list[int], densities: list[float], reps: int, sort_max: int
) -> list[dict]:
    rows = []
    gen = torch.Generator().manual_seed(0)
    for n in sizes:
        x = torch.randn(n, generator=gen).to(device)
        for density in densities:
            k = max(1, int(n * density))
            t_topk = _time(lambda x=x, k=k: topk(x, k), device, reps)
            t_ms = _time(lambda x=x, k=k: mstopk(x, k), device, reps)
            t_sort = _time(lambda x=x, k=k: _sort_topk(x, k), device, reps) if n <= sort_max else float("nan")
            _, idx = mstopk(x, k)
            assert idx.numel() == k
            rows.append({
                "device": device.type, "n": n, "density": density, "k": k, "topk_ms": t_topk * 1e3,
                "mstopk_ms": t_ms * 1e3, "sort_ms": t_sort * 1e3, "recall": recall(idx, x, k),
                "speedup_vs_topk": t_topk / t_ms,
            })  # fmt: skip
            r = rows[-1]
            print(
                f"| {device.type} | {n:.0e} | {density} | {r['sort_ms']:.1f} | {r['topk_ms']:.1f} | "
                f"{r['mstopk_ms']:.1f} | {r['speedup_vs_topk']:.2f}x | {r['recall']:.4f} |",
                flush=True,
            )
        del x
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1e6,1e7,1e8")
    p.add_argument("--densities", default="0.001,0.01")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--devices", default="cpu,cuda")
    p.add_argument("--sort-max", type=float, default=1e7, help="largest n timed with a full sort on CPU")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--json", default=None, help="also write the rows here")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    densities = [float(d) for d in args.densities.split(",")]
    print(
        "| device | elements | density | sort ms | torch.topk ms | MSTopK ms | topk/MSTopK | MSTopK recall |"
    )
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for name in args.devices.split(","):
        if name == "cuda" and not torch.cuda.is_available():
            continue
        dev = torch.device(name)
        rows += bench(dev, sizes, densities, args.reps, int(args.sort_max) if name == "cpu" else 1 << 62)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

"""The tables of ``bench_skew.py``: per-sample prep spread, loaders against the bound, skew alone replayed."""

from __future__ import annotations

import argparse
import statistics

import numpy as np

LOADERS = {
    "torch": "torch DataLoader, in_order=True",
    "torch_any": "torch DataLoader, in_order=False",
    "coordl": "coordl.DataLoader (today's defaults)",
    "coordl_any": "coordl.DataLoader, in_order=False",
}


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def _prep_rows(args: argparse.Namespace, res: dict) -> tuple[list[str], dict[str, float]]:
    cores = args.workers
    out = [
        f"### Per-sample prep CPU, train_transform(224), one core ({args.n} files, median of "
        f"{args.rounds} passes)\n",
        f"| dataset | mean file | p50 | p90 | p99 | max | p99/p50 | mean | bound at {cores} cores |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    bound = {}
    for ds, v in res.items():
        passes = v["prep"]
        stat = {q: statistics.median(_pct(p["cpu_s"], q) * 1e3 for p in passes) for q in (50, 90, 99, 100)}
        mean_ms = statistics.median(float(np.mean(p["cpu_s"])) * 1e3 for p in passes)
        bound[ds] = cores / mean_ms * 1e3
        kb = float(np.mean(passes[0]["bytes"])) / 1e3
        out.append(
            f"| {ds} | {kb:.0f} KB | {stat[50]:.2f} ms | {stat[90]:.2f} ms | {stat[99]:.2f} ms | "
            f"{stat[100]:.1f} ms | {stat[99] / stat[50]:.1f}x | {mean_ms:.2f} ms | {bound[ds]:,.0f}/s |"
        )
    return out, bound


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def _run_stats(runs: list[dict]) -> dict[str, list[float]]:
    """Per run (epochs 2 on, medians): whole-epoch rate, the rate with the waits for a CPU taken out, shares."""
    out: dict[str, list[float]] = {"rate": [], "free": [], "waiting": [], "blocked": []}
    for run in runs:
        free = [r / (1.0 - w) for r, w in zip(run["rates"], run["waiting"], strict=True)]
        out["rate"].append(statistics.median(run["rates"]))
        out["free"].append(statistics.median(free))
        out["waiting"].append(statistics.median(run["waiting"]))
        out["blocked"].append(statistics.median(run["blocked"]))
    return out


def table(args: argparse.Namespace, res: dict) -> str:
    out, bound = _prep_rows(args, res)
    out += [
        f"\n### Loaders against the work-conserving bound: batch {args.batch}, {args.workers} workers, "
        f"epochs 2-{args.epochs}, median (min-max) of {args.rounds} rounds\n",
        "| dataset | loader | samples/s | workers waiting for a CPU | workers blocked | "
        "samples/s, CPU waits out | of the bound | steady samples/s | batch wait p50 | p99 | "
        "workers CPU/sample |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for ds, v in res.items():
        out.append(
            f"| {ds} | work-conserving bound: {args.workers} cores / mean prep CPU | | | | "
            f"{bound[ds]:,.0f} | 100% | | | | |"
        )
        pool = _run_stats(v["pool"])
        out.append(
            f"| {ds} | measured executor: {args.workers} processes, each taking the next sample | "
            f"{_spread(pool['rate'])} | {statistics.median(pool['waiting']):.0%} | "
            f"{statistics.median(pool['blocked']):.0%} | {_spread(pool['free'])} | "
            f"{statistics.median(pool['free']) / bound[ds]:.0%} | | | | |"
        )
        for cfg in (c for c in v if c not in ("prep", "pool")):
            st = _run_stats(v[cfg])
            steady = [statistics.median(run["steady"]) for run in v[cfg]]
            waits = [w for run in v[cfg] for w in run["waits"]]
            cpu_ms = statistics.median(statistics.median(run["workers_cpu_s"]) for run in v[cfg]) * 1e3
            out.append(
                f"| {ds} | {LOADERS[cfg]} | {_spread(st['rate'])} | {statistics.median(st['waiting']):.0%} | "
                f"{statistics.median(st['blocked']):.0%} | {_spread(st['free'])} | "
                f"{statistics.median(st['free']) / bound[ds]:.0%} | {_spread(steady)} | "
                f"{_pct(waits, 50) * 1e3:.1f} ms | {_pct(waits, 99) * 1e3:.1f} ms | {cpu_ms:.2f} ms |"
            )
    out += _replay_rows(args, res)
    return "\n".join(out)


def _replay_rows(args: argparse.Namespace, res: dict) -> list[str]:
    import skew_sim

    batch = getattr(args, "replay_batch", 0) or args.batch
    out = [
        f"\n### Skew alone: torch's dispatch replayed on the measured sample times (batch {batch}, "
        "prefetch 2, one ImageNet-sized epoch drawn from them without the CMYK and PNG files, no loader cost, "
        "no other work on the cores)\n",
        "| dataset | workers | in_order=True | in_order=False | sample-level assembly |",
        "|---|---|---|---|---|",
    ]
    for ds, v in res.items():
        # the CMYK and PNG files at ImageNet's rate (23 in 1.28M): none in a replayed epoch
        cpu_s = [
            t
            for p in v["prep"]
            for t, rare in zip(p["cpu_s"], p.get("rare", []) or [False] * len(p["cpu_s"]), strict=True)
            if not rare
        ]
        for w in (int(x) for x in args.replay_workers.split(",")):
            r = skew_sim.replay(cpu_s, w, batch)
            out.append(
                f"| {ds} | {w} | {r['in_order']:.1%} | {r['any_order']:.1%} | {r['sample_level']:.1%} |"
            )
    return out

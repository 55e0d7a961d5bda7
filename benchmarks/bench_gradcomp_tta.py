"""Time to accuracy: DDP allreduce vs PyTorch's fp16 and PowerSGD hooks vs gradcomp, over emulated links.

    .venv/bin/python benchmarks/bench_gradcomp_tta.py                          # 100 and 1000 Mbit/s, VGG-like
    .venv/bin/python benchmarks/bench_gradcomp_tta.py --rates 1000 --methods ddp,mstopk-auto --target-acc 0.8

Each run is ``gradcomp train --target-acc A --eval-every N`` on ranks in network namespaces (see
``bench_gradcomp_e2e.py``: same networks, same methods, same launcher). Every method trains the same model on the
same in-memory synthetic task from the same seed and stops, on all ranks together, at the first held-out evaluation
at or above the target (``--max-iters`` caps a run that never gets there). Prints, per link: iterations and
training seconds to the target (evaluation passes excluded), the ratio of DDP allreduce's time to the method's
(same network, same invocation), the median iteration time and the last held-out accuracy. Needs root.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gradcomp_e2e import METHODS, run_one  # noqa: E402

from tests.support.netns import VirtualNetwork, cleanup_stale  # noqa: E402

TTA_METHODS = ["ddp", "torch-fp16", "torch-powersgd", "topk", "mstopk", "gtopk", "mstopk-auto"]


def _row(link: str, method: str, reps: list[dict], base_s: float | None) -> tuple[dict, str]:
    """Medians over repeats (a run that missed the target counts as not reached); ``base_s``: DDP's time."""
    reached = [r for r in reps if r["time_to_accuracy_s"] is not None]
    row = {
        "link": link,
        "method": method,
        "runs": len(reps),
        "reached": len(reached),
        "iters_to_accuracy": [r["iters_to_accuracy"] for r in reps],
        "time_to_accuracy_s": [r["time_to_accuracy_s"] for r in reps],
        "iter_s": statistics.median(r["summary"]["iter_s"] for r in reps),
        "eval_acc": statistics.median(r["eval_acc"] for r in reps),
        "eval_curves": [r["eval_curve"] for r in reps],
        "planner": reps[0]["planner"],
    }
    if len(reached) * 2 > len(reps):  # a majority reached it: the median is a reached value
        row["tta_s"] = statistics.median(r["time_to_accuracy_s"] or float("inf") for r in reps)
        row["tta_iters"] = statistics.median(r["iters_to_accuracy"] or float("inf") for r in reps)
        tta = f"{row['tta_s']:.1f}"
        iters = f"{row['tta_iters']:g}"
        base_s = row["tta_s"] if method == "ddp" else base_s
        ratio = f"{base_s / row['tta_s']:.2f}x" if base_s else "-"
    else:
        row["tta_s"] = row["tta_iters"] = None
        last = max(len(c) and c[-1][0] for c in row["eval_curves"])
        tta, iters, ratio = "not reached", f"> {last}", "-"
    line = (
        f"| {link} | {method} | {iters} | {tta} | {ratio} | {row['iter_s'] * 1e3:.0f} | "
        f"{row['eval_acc']:.3f} | {len(reached)}/{len(reps)} |"
    )
    return row, line


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="100,1000", help="link rates in Mbit/s; 'none' = unthrottled")
    p.add_argument("--model", default="vgg")
    p.add_argument("--methods", default=",".join(TTA_METHODS), help=f"of {','.join(METHODS)}")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--ranks-per-node", type=int, default=1)
    p.add_argument("--target-acc", type=float, default=0.85, help="held-out accuracy to reach")
    p.add_argument("--max-iters", type=int, default=300, help="cap per run")
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--eval-samples", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8, help="per rank")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--signal", type=float, default=0.5, help="task difficulty (see gradcomp train --signal)")
    p.add_argument("--ratio", type=float, default=0.01)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    p.add_argument("--json", default="reports/runs/bench_gradcomp_tta.json")
    p.add_argument("--netns-prefix", default="gtta")
    args = p.parse_args()
    if args.ranks % args.ranks_per_node:
        p.error("--ranks must be a multiple of --ranks-per-node")
    args.iters = args.max_iters  # run_one's name for the cap
    extra = [
        "--target-acc", str(args.target_acc), "--eval-every", str(args.eval_every),
        "--eval-samples", str(args.eval_samples), "--lr", str(args.lr), "--signal", str(args.signal),
    ]  # fmt: skip
    cleanup_stale(args.netns_prefix)
    out_dir = Path(tempfile.mkdtemp(prefix="gradcomp-tta-"))
    results = []
    print(
        f"{args.model}, {args.ranks} ranks ({args.ranks_per_node} per node), batch {args.batch_size}/rank, "
        f"target held-out accuracy {args.target_acc:g}, cap {args.max_iters} iterations, {args.repeat} run(s)"
    )
    print(
        "| link | method | iters to target | s to target | vs DDP | iteration ms | held-out acc | reached |"
    )
    print("|---|---|---|---|---|---|---|---|")
    methods = args.methods.split(",")
    for rate_text in args.rates.split(","):
        rate = None if rate_text == "none" else float(rate_text)
        link = "unthrottled" if rate is None else f"{rate:g} Mbit/s"
        runs: dict[str, list[dict]] = {m: [] for m in methods}
        nodes = args.ranks // args.ranks_per_node
        with VirtualNetwork(nodes, rate_mbit=rate, prefix=args.netns_prefix) as net:
            for rnd in range(args.repeat):  # rounds interleave the methods against slow drifts of the machine
                for method in methods:
                    rep = run_one(net, method, args.model, args, out_dir, f"tta-{rate_text}-{rnd}", extra)
                    if rep is not None:
                        runs[method].append(rep)
        base_s = None
        for method in methods:
            if not runs[method]:
                print(f"| {link} | {method} | failed | | | | | |", flush=True)
                continue
            row, line = _row(link, method, runs[method], base_s)
            base_s = row["tta_s"] if method == "ddp" else base_s
            results.append(row)
            print(line, flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    main()

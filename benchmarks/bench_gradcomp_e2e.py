"""End to end: DDP allreduce vs PyTorch's fp16 and PowerSGD hooks vs gradcomp, over emulated links.

    .venv/bin/python benchmarks/bench_gradcomp_e2e.py                       # all rates, both models
    .venv/bin/python benchmarks/bench_gradcomp_e2e.py --rates 1000 --models vgg --iters 20

Each run is ``gradcomp train`` on ``--ranks`` ranks in network namespaces ("nodes" of ``--ranks-per-node`` ranks each)
joined by a bridge whose links are limited with tc tbf to the given rate (``none``: unthrottled veth), built by
``tests.support.netns``. Ranks of one node talk over the namespace's own address (loopback, not limited); each
node's link is shared by its ranks, as a real node's NIC is. ``hitopk`` needs 2+ ranks per node to be hierarchical. Data are
in-memory tensors, so the numbers isolate compute and communication. Prints, per (model, rate), the median over
``--repeat`` runs of each method's median iteration time (after warm-up), its speed-up over DDP allreduce measured in the same network, the
exposed communication time, and the running training accuracy at the end. Needs root (network namespaces).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.netns import VirtualNetwork, cleanup_stale

METHODS = {
    "ddp": ["--baseline", "ddp"],
    "torch-fp16": ["--baseline", "torch-fp16"],
    "torch-powersgd": ["--baseline", "torch-powersgd", "--powersgd-rank", "2"],
    "topk": ["--compressor", "topk", "--plan", "always"],
    "mstopk": ["--compressor", "mstopk", "--plan", "always"],
    "gtopk": ["--compressor", "gtopk", "--plan", "always"],
    "mstopk-auto": ["--compressor", "mstopk", "--plan", "auto"],
    "hitopk": ["--compressor", "hitopk", "--plan", "always"],
}
DEFAULT_METHODS = [m for m in METHODS if m != "hitopk"]


def run_one(
    net: VirtualNetwork,
    method: str,
    model: str,
    args,
    out_dir: Path,
    tag: str,
    extra: list[str] | None = None,
) -> dict | None:
    """One ``gradcomp train`` run on every rank of ``net``; rank 0's JSON report, or None if a rank failed."""
    port = net.hosts[0].free_port()
    report = out_dir / f"{tag}-{method}.json"
    common = [
        sys.executable, "-m", "gradcomp.cli", "train", "--data", "tensors", "--model", model,
        "--iters", str(args.iters), "--batch-size", str(args.batch_size), "--ratio", str(args.ratio),
        "--warmup-iters", "5", "--report", str(report), "--quiet",
    ] + METHODS[method] + list(extra or [])  # fmt: skip
    procs = []
    per_node = args.ranks_per_node
    for rank in range(args.ranks):
        env = net.dist_env(rank, args.ranks, master_port=port, ranks_per_host=per_node)
        env["OMP_NUM_THREADS"] = str(args.threads)
        procs.append(
            net.hosts[rank // per_node].popen(
                common, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
        )
    ok = True
    for p in procs:
        try:
            _, err = p.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
            ok = False
        if p.returncode != 0:
            ok = False
            tail = err.decode(errors="replace").strip().splitlines()[-3:]
            print(f"  {method} failed (rc {p.returncode}): {' | '.join(tail)}", file=sys.stderr)
    if not ok or not report.exists():
        return None
    return json.loads(report.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="100,1000,none", help="link rates in Mbit/s; 'none' = unthrottled")
    p.add_argument("--models", default="vgg,small")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS), help=f"of {','.join(METHODS)}")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--ranks-per-node", type=int, default=1, help="ranks sharing one namespace (node)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--repeat", type=int, default=3, help="runs per method (medians of the per-run medians)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--ratio", type=float, default=0.01)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json", default="reports/runs/bench_gradcomp_e2e.json")
    p.add_argument("--netns-prefix", default="grad", help="namespace-name prefix (lowercase letters/digits)")
    args = p.parse_args()
    if args.ranks % args.ranks_per_node:
        p.error("--ranks must be a multiple of --ranks-per-node")
    cleanup_stale(args.netns_prefix)
    results = []
    out_dir = Path(tempfile.mkdtemp(prefix="gradcomp-e2e-"))
    print(
        "| model | link | method | iteration ms | vs DDP | comm exposed ms | compressed buckets | acc@end | runs |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        for rate_text in args.rates.split(","):
            rate = None if rate_text == "none" else float(rate_text)
            link = "unthrottled" if rate is None else f"{rate:g} Mbit/s"
            methods = args.methods.split(",")
            runs: dict[str, list[dict]] = {m: [] for m in methods}
            nodes = args.ranks // args.ranks_per_node
            with VirtualNetwork(nodes, rate_mbit=rate, prefix=args.netns_prefix) as net:
                # Rounds interleave the methods, so slow drifts of the shared machine hit them all alike.
                for rnd in range(args.repeat):
                    for method in methods:
                        rep = run_one(net, method, model, args, out_dir, f"{model}-{rate_text}-{rnd}")
                        if rep is not None:
                            runs[method].append(rep)
            base = None
            for method in methods:
                if not runs[method]:
                    continue
                per_run = [r["summary"] for r in runs[method]]
                s = dict(per_run[0])
                for key in (
                    "iter_s",
                    "comm_exposed_s",
                    "compute_s",
                    "comm_s",
                    "final_acc",
                    "compressed_buckets",
                ):
                    s[key] = statistics.median(x[key] for x in per_run)
                base = s["iter_s"] if method == "ddp" else base
                speed = f"{base / s['iter_s']:.2f}x" if base else "-"
                results.append({
                    "model": model, "link": link, "method": method, "runs": len(per_run), **s,
                    "iter_s_runs": [x["iter_s"] for x in per_run], "planner": runs[method][0]["planner"],
                })  # fmt: skip
                print(
                    f"| {model} | {link} | {method} | {s['iter_s'] * 1e3:.0f} | {speed} | "
                    f"{s['comm_exposed_s'] * 1e3:.0f} | {s['compressed_buckets']:g} | {s['final_acc']:.2f} | "
                    f"{len(per_run)} |",
                    flush=True,
                )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    main()

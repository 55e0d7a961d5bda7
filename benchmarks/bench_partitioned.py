"""Partitioned MinIO cache across emulated nodes vs each node's own MinIO cache vs torch DataLoader.

Setup: ``--nodes`` N network namespaces (one rank each, gloo) plus one storage namespace, joined by a
bridge (:class:`tests.support.netns.VirtualNetwork`). Node links run at ``--node-mbit``; the storage host's
link at ``--storage-mbit``, shared by all nodes like an NFS server's. Storage serves ``--items`` items
of ``--item-kb`` KiB from RAM (a redis-server of its own), so its only limit is its link. Each node has a cache budget of
1/N of the dataset plus 10 % slack. Prep is trivial by default (the runs are fetch-bound, the case the
partitioned cache addresses); ``--prep-ms`` burns that much CPU per item to show where prep caps it.

Per rank the same process runs, one after the other, ``--epochs`` epochs of:

* ``torch``: ``torch.utils.data.DataLoader`` + ``DistributedSampler`` (no cache);
* ``minio``: ``coordl.DataLoader(cache_bytes=budget)`` + ``DistributedSampler``: each node caches what
  it reads, alone;
* ``partitioned``: ``coordl.DataLoader(cache_bytes=budget, partitioned=True)``;
* ``partitioned-tls``: the same with ``partitioned=coordl.PartitionedOptions(tls=True)``: every node's
  Redis TLS only, client certificates of the job's CA, derived from ``COORDL_PEER_SECRET`` (``--tls``
  runs ``partitioned`` and this, in alternating order per run, and prints the TLS / plain-text ratio).

Reported per mode (median over ``--reps`` runs): epoch-1 and steady-state (median of epochs 2..E)
samples/s of the whole job (a barrier ends each epoch), and storage MB read per epoch by all nodes.

Run (root, about 4 minutes on 2 cores): ``.venv/bin/python benchmarks/bench_partitioned.py``;
the cost of TLS: ``.venv/bin/python benchmarks/bench_partitioned.py --nodes 2 --tls --reps 6``.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for tests.support

MODES = ("torch", "minio", "partitioned", "partitioned-tls")

STORAGE = r"""
import os, sys, time
import redis
from memcache.server import start_redis

n, size, ip = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
blob = bytes((i * 7 + 3) % 256 for i in range(size + n))
server = start_redis(n * size * 2 + (64 << 20), host=ip, password=os.environ["BENCH_STORAGE_SECRET"], die_with_parent=True)
r = redis.Redis(host=ip, port=server.port, password=os.environ["BENCH_STORAGE_SECRET"])
for i in range(n):
    r.set(f"s:{i}", blob[i : i + size])
print(server.port, flush=True)
time.sleep(3600)
"""

RANK = r"""
import datetime, json, os, sys, time
import torch, torch.distributed as dist
import coordl
from shmem.counters import SharedCounters
import psutil
import redis

storage_ip, storage_port, n_items, item_bytes, epochs, workers = sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:7])
modes, prep_ms = sys.argv[7].split(","), float(sys.argv[8])
torch.set_num_threads(1)

class RemoteStorage:
    # An item source whose fetch reads from the storage host; counts bytes across worker processes.
    def __init__(self, counters):
        self.counters = counters
        self.client = None
    def __getstate__(self):
        return {"counters": self.counters, "client": None}
    def __len__(self):
        return n_items
    def fetch(self, i):
        if self.client is None:  # per process (redis-py's pool also opens new sockets after a fork)
            self.client = redis.Redis(host=storage_ip, port=storage_port, password=os.environ["BENCH_STORAGE_SECRET"],
                                      socket_timeout=60)
        raw = self.client.get(f"s:{i}")
        if raw is None:
            raise OSError(f"storage did not return item {i}")
        self.counters.add("storage_bytes", len(raw))
        return raw
    def prep(self, raw, i):
        # Simulated CPU prep: burn --prep-ms of CPU per item (decode + augment would cost ~1-3 ms).
        end = time.thread_time() + prep_ms / 1000
        while time.thread_time() < end:
            pass
        return raw[0] + raw[-1]

class TorchDataset(torch.utils.data.Dataset):
    def __init__(self, src):
        self.src = src
    def __len__(self):
        return len(self.src)
    def __getitem__(self, i):
        return self.src.prep(self.src.fetch(i), i)

def node_cpu_s():
    # CPU seconds of this rank, its loader workers and the node's Redis (its child): what TLS would add to.
    total = 0.0
    me = psutil.Process()
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
rank, world = dist.get_rank(), dist.get_world_size()
budget = int(n_items * item_bytes / world * 1.1) + (1 << 20)
for mode in modes:
    counters = SharedCounters(["storage_bytes"])
    src = RemoteStorage(counters)
    dss = lambda: torch.utils.data.distributed.DistributedSampler(range(n_items), world, rank, shuffle=True, seed=0)
    kw = dict(batch_size=16, num_workers=workers, persistent_workers=workers > 0)
    if mode == "torch":
        loader = torch.utils.data.DataLoader(TorchDataset(src), sampler=dss(), **kw)
    elif mode == "minio":
        loader = coordl.DataLoader(src, sampler=dss(), cache_bytes=budget, **kw)
    else:
        options = coordl.PartitionedOptions(tls=mode == "partitioned-tls")
        loader = coordl.DataLoader(src, shuffle=True, cache_bytes=budget, partitioned=options, **kw)
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        dist.barrier()
        before = counters.snapshot()["storage_bytes"]
        t0, cpu0 = time.perf_counter(), node_cpu_s()
        n = sum(len(b) for b in loader)
        cpu_s = node_cpu_s() - cpu0
        dist.barrier()
        secs = time.perf_counter() - t0
        print(json.dumps({"mode": mode, "epoch": epoch, "secs": secs, "n": n, "cpu_s": cpu_s,
                          "storage_bytes": counters.snapshot()["storage_bytes"] - before}), flush=True)
    if mode != "torch":
        st = loader.stats()
        print(json.dumps({"mode": mode, "final": True, **{k: st.get(k, 0) for k in ("remote_hits", "remote_bytes", "remote_errors")}}), flush=True)
        loader.close()
    else:
        del loader
    counters.close()
dist.destroy_process_group()
"""


def run_once(args: argparse.Namespace, n_nodes: int, tmp: Path, modes: list[str]) -> list[dict]:
    from tests.support.netns import VirtualNetwork

    (tmp / "storage.py").write_text(STORAGE)
    (tmp / "rank.py").write_text(RANK)
    item_bytes = args.item_kb * 1024
    # The storage stand-in is a redis-server of its own (plain GETs, no cache semantics) on the slow link.
    # COORDL_PEER_SECRET: the job's CA for TLS across nodes is derived from it (the same on every rank).
    env = {
        "BENCH_STORAGE_SECRET": "bench-storage-secret-0123456789",
        "COORDL_PEER_SECRET": secrets.token_hex(32),
    }
    with VirtualNetwork(n_nodes + 1, rate_mbit=args.node_mbit, prefix="cdlbench") as net:
        store = net.hosts[n_nodes]
        net.set_rate(n_nodes, args.storage_mbit)
        server = store.popen(
            [sys.executable, str(tmp / "storage.py"), str(args.items), str(item_bytes), store.ip],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        storage_port = int(server.stdout.readline())
        master_port = net.hosts[0].free_port()
        argv = [sys.executable, str(tmp / "rank.py"), store.ip, str(storage_port), str(args.items), str(item_bytes),
                str(args.epochs), str(args.workers), ",".join(modes), str(args.prep_ms)]  # fmt: skip
        procs = [
            net.hosts[r].popen(
                argv,
                env={**net.dist_env(r, n_nodes, master_port), "OMP_NUM_THREADS": "1", **env},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for r in range(n_nodes)
        ]
        outs = [p.communicate(timeout=args.timeout_s) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        if p.returncode != 0:
            raise RuntimeError(f"a rank failed (rc {p.returncode}):\n{err[-3000:]}")
    recs = []
    for rank, (out, _) in enumerate(outs):
        for line in out.splitlines():
            if line.startswith("{"):
                recs.append({"rank": rank, **json.loads(line)})
    return recs


def summarize(runs: list[list[dict]], n_items: int, epochs: int, modes: list[str]) -> dict[str, dict]:
    out = {}
    for mode in modes:
        first, steady, mb_first, mb_steady = [], [], [], []
        remote_mb = []
        for recs in runs:
            ep = [r for r in recs if r["mode"] == mode and "epoch" in r]
            secs = {e: max(r["secs"] for r in ep if r["epoch"] == e) for e in range(epochs)}
            mb = {e: sum(r["storage_bytes"] for r in ep if r["epoch"] == e) / 1e6 for e in range(epochs)}
            first.append(n_items / secs[0])
            steady.append(statistics.median(n_items / secs[e] for e in range(1, epochs)))
            mb_first.append(mb[0])
            mb_steady.append(statistics.median(mb[e] for e in range(1, epochs)))
            fin = [r for r in recs if r["mode"] == mode and r.get("final")]
            # Peers serve nothing in epoch 1 (each item is read once per epoch, and nobody had it yet).
            remote_mb.append(sum(r["remote_bytes"] for r in fin) / 1e6 / max(1, epochs - 1))
        out[mode] = {
            "epoch1_sps": statistics.median(first),
            "steady_sps": statistics.median(steady),
            "storage_mb_epoch1": statistics.median(mb_first),
            "storage_mb_steady": statistics.median(mb_steady),
            "peer_mb_per_epoch": statistics.median(remote_mb),
        }
    return out


def print_table(n_nodes: int, summary: dict[str, dict], args: argparse.Namespace) -> None:
    base_mode = "torch" if "torch" in summary else next(iter(summary))
    base = summary[base_mode]["steady_sps"]
    print(
        f"\n{n_nodes} nodes, {args.items} items x {args.item_kb} KiB, storage link {args.storage_mbit} Mbit/s, "
        f"node links {args.node_mbit} Mbit/s, cache per node 1/{n_nodes} + 10%, prep {args.prep_ms} ms/item, "
        "one Redis per node"
    )
    head = ("mode", "epoch-1 samples/s", "steady samples/s", f"vs {base_mode}", "storage MB ep1", "storage MB/epoch after",
            "peer MB/epoch after")  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for mode, s in summary.items():
        print(
            f"| {mode} | {s['epoch1_sps']:.0f} | {s['steady_sps']:.0f} | {s['steady_sps'] / base:.2f}x | "
            f"{s['storage_mb_epoch1']:.1f} | {s['storage_mb_steady']:.1f} | {s['peer_mb_per_epoch']:.1f} |"
        )


def print_tls(runs: list[list[dict]], n_items: int, epochs: int) -> None:
    """Per run, steady samples/s and CPU per item (all nodes' ranks, workers and Redis) plain and TLS,
    measured in the same run (order alternating), and the ratios."""
    print(
        "\n| run | first | plain samples/s | TLS samples/s | TLS / plain | plain CPU ms/item | TLS CPU ms/item "
        "| TLS / plain CPU |"
    )
    print("|---|---|---|---|---|---|---|---|")
    ratios, cpu_ratios = [], []
    for k, recs in enumerate(runs):
        rate, cpu = {}, {}
        for mode in ("partitioned", "partitioned-tls"):
            ep = [r for r in recs if r["mode"] == mode and "epoch" in r]
            secs = [max(r["secs"] for r in ep if r["epoch"] == e) for e in range(1, epochs)]
            rate[mode] = statistics.median(n_items / s for s in secs)
            cpus = [sum(r["cpu_s"] for r in ep if r["epoch"] == e) for e in range(1, epochs)]
            cpu[mode] = statistics.median(1000 * c / n_items for c in cpus)
        first = next(r["mode"] for r in recs if "epoch" in r)
        ratios.append(rate["partitioned-tls"] / rate["partitioned"])
        cpu_ratios.append(cpu["partitioned-tls"] / cpu["partitioned"])
        print(
            f"| {k + 1} | {first} | {rate['partitioned']:.0f} | {rate['partitioned-tls']:.0f} | {ratios[-1]:.2f} "
            f"| {cpu['partitioned']:.3f} | {cpu['partitioned-tls']:.3f} | {cpu_ratios[-1]:.2f} |"
        )
    for what, r in (("steady samples/s", ratios), ("CPU per item", cpu_ratios)):
        print(
            f"TLS / plain {what}: median {statistics.median(r):.2f}, min {min(r):.2f}, max {max(r):.2f} over {len(r)} runs"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[2, 3])
    p.add_argument("--items", type=int, default=400)
    p.add_argument("--item-kb", type=int, default=100)
    p.add_argument("--storage-mbit", type=float, default=100)
    p.add_argument("--node-mbit", type=float, default=1000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--prep-ms", type=float, default=0.0, help="CPU-seconds of simulated prep per item, in ms")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument(
        "--tls", action="store_true", help="partitioned plain vs TLS only, alternated, with ratios"
    )
    p.add_argument("--timeout-s", type=float, default=600)
    p.add_argument("--json", help="also write the summaries and every run's records here")
    args = p.parse_args()
    from tests.support.netns import skip_reason

    reason = skip_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    if args.tls:
        args.modes = ["partitioned", "partitioned-tls"]
    results, all_runs = {}, {}
    for n_nodes in args.nodes:
        runs = []
        for rep in range(args.reps):
            t0 = time.perf_counter()
            modes = args.modes[::-1] if args.tls and rep % 2 else args.modes  # alternate which goes first
            with tempfile.TemporaryDirectory() as tmp:
                runs.append(run_once(args, n_nodes, Path(tmp), modes))
            print(
                f"[{n_nodes} nodes, run {rep + 1}/{args.reps}: {time.perf_counter() - t0:.0f} s]",
                file=sys.stderr,
            )
        all_runs[n_nodes] = runs
        results[n_nodes] = summarize(runs, args.items, args.epochs, args.modes)
        print_table(n_nodes, results[n_nodes], args)
        if args.tls:
            print_tls(runs, args.items, args.epochs)
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": results, "runs": all_runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

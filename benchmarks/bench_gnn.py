"""GLoader: sampling-based GraphSAGE training on throttled storage, loaders side by side.

    sudo .venv/bin/python benchmarks/bench_gnn.py          # ~10 min on a 2-core VM

A 2-layer GraphSAGE (plain torch, ``coordl.graph.GraphSAGE``) trains on an R-MAT graph (``coordl
graph synth``) whose features live on a throttled loop device with a bounded page cache
(``benchmarks/slowstore.py``). Each mode runs in a fresh child process, page cache evicted first,
for ``--epochs`` epochs over the same seeds in the same order with the same sampled neighbourhoods:

``seq``    a hand-written loop: sample (coordl's sampler) -> ``features[input_nodes]`` -> step.
           What a user writes without a loader. ``seq2``: the same with 2 torch threads.
``pyg``    PyG's ``NeighborLoader``, when it can run here (it needs pyg-lib or torch-sparse).
``cache``  ``cg.NeighborLoader`` with the hot-feature cache, no pipelining (``pipeline_depth=0``).
``pipe``   ``cg.NeighborLoader`` with the cache and pipelining (``--workers`` processes, ``--depth``).
``pipe0``  (optional) pipelining without the cache: what each of the two parts brings.

Memory is the same for every mode: the loaders with a cache get ``page_cache - cache`` of page cache.
The step uses 1 torch thread (except ``seq2``), so one core is left for loading work.

"Loading exposed" is the time the loop waited for batches (for ``seq``: sampling + gathering);
"hidden" is ``1 - exposed(mode) / exposed(cache)``: the share of the unpipelined loader's loading
time the mode overlaps with compute (same cache, same reads). Compute alone is measured too, by
replaying one batch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

MiB = 1 << 20
HERE = Path(__file__).resolve().parent
MODES = ("seq", "seq2", "pyg", "cache", "pipe0", "pipe")
DEFAULT_MODES = ("seq", "seq2", "pyg", "cache", "pipe")


# -- child: one mode, several epochs, inside the cgroups -----------------------------------------


def _model_and_step(graph, hidden: int, layers: int):
    import torch

    from coordl.graph.models import GraphSAGE

    torch.manual_seed(0)
    model = GraphSAGE(int(graph.features.shape[1]), hidden, int(graph.labels.max()) + 1, num_layers=layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(batch) -> float:
        loss = torch.nn.functional.cross_entropy(model(batch), batch.y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    return step


def _seq_batches(graph, args, epoch: int):
    """The hand-written loop's batches: same seeds, same sampling as the loader, plain gather."""
    import numpy as np
    import torch

    from coordl.graph.batch import Batch
    from coordl.graph.maker import BatchMaker

    maker = BatchMaker(
        graph,
        np.asarray(graph.train_idx),
        args.fanouts,
        args.batch_size,
        True,
        False,
        args.seed,
        cache=None,
        counters=None,
    )
    for b in range(len(maker)):
        seeds, blocks = maker.sample(epoch, b)
        x = torch.from_numpy(np.asarray(graph.features[blocks.input_nodes]))
        local = [(torch.from_numpy(s), torch.from_numpy(d)) for s, d in blocks.local_edges]
        nodes = torch.from_numpy(blocks.input_nodes)
        yield Batch(
            torch.from_numpy(seeds.copy()),
            nodes,
            x,
            torch.from_numpy(np.asarray(graph.labels[seeds])),
            [(nodes[s], nodes[d]) for s, d in local],
            blocks.sizes,
            local,
        )


def _pyg_loader(graph, args):
    import torch
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader as PygLoader

    dst = torch.repeat_interleave(torch.arange(graph.num_nodes), torch.from_numpy(graph.in_degree()))
    data = Data(
        x=torch.from_numpy(graph.features),
        y=torch.from_numpy(graph.labels),
        edge_index=torch.stack([torch.from_numpy(graph.indices.astype("int64")), dst]),
    )
    return PygLoader(
        data,
        num_neighbors=args.fanouts,
        input_nodes=torch.from_numpy(graph.train_idx),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
    )


def child(args: argparse.Namespace) -> None:
    import torch

    from coordl.graph.graph import Graph
    from coordl.graph.loader import NeighborLoader

    torch.set_num_threads(2 if args.child == "seq2" else 1)
    graph = Graph.load(args.graph)
    step = _model_and_step(graph, args.hidden, len(args.fanouts))
    loader = None
    if args.child in ("cache", "pipe", "pipe0"):
        pipe = args.child != "cache"
        cache_bytes = 0 if args.child == "pipe0" else args.cache_mib * MiB
        loader = NeighborLoader(
            graph,
            graph.train_idx,
            args.fanouts,
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=args.workers if pipe else 0,
            pipeline_depth=args.depth if pipe else 0,
            feature_cache_bytes=cache_bytes,
            seed=args.seed,
        )
    elif args.child == "pyg":
        loader = _pyg_loader(graph, args)
    epochs = []
    for epoch in range(args.epochs):
        batches = _seq_batches(graph, args, epoch) if loader is None else iter(loader)
        waited, n, t0 = 0.0, 0, time.perf_counter()
        while True:
            w0 = time.perf_counter()
            batch = next(batches, None)
            waited += time.perf_counter() - w0
            if batch is None:
                break
            step(batch)
            n += 1
        epochs.append({"time_s": time.perf_counter() - t0, "exposed_s": waited, "batches": n})
    stats = loader.stats() if hasattr(loader, "stats") else {}
    first = next(_seq_batches(graph, args, 0))
    t0 = time.perf_counter()
    for _ in range(10):
        step(first)
    compute_per_batch_s = (time.perf_counter() - t0) / 10
    if hasattr(loader, "close"):
        loader.close()
    print(json.dumps({"epochs": epochs, "stats": stats, "compute_per_batch_s": compute_per_batch_s}))


# -- parent: graph on slow storage, runs, table ----------------------------------------------------


def _pyg_available() -> str | None:
    """None when PyG's NeighborLoader can sample here, else why not."""
    try:
        import torch_geometric  # noqa: F401
    except ImportError:
        return "torch_geometric is not installed"
    try:
        import pyg_lib  # noqa: F401

        return None
    except ImportError:
        pass
    try:
        import torch_sparse  # noqa: F401

        return None
    except ImportError:
        return "torch_geometric installs, but its NeighborLoader needs pyg-lib or torch-sparse: neither installs here"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", choices=MODES)
    p.add_argument("--graph", type=Path)
    p.add_argument("--nodes", type=int, default=250_000)
    p.add_argument("--edges", type=int, default=3_000_000)
    p.add_argument("--feature-dim", type=int, default=512)
    p.add_argument("--train-fraction", type=float, default=0.06)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--fanouts", type=lambda s: [int(v) for v in s.split(",")], default=[15, 10])
    p.add_argument("--hidden", type=int, default=1024, help="GraphSAGE hidden size: sets compute per batch")
    p.add_argument("--read-mb-per-s", type=int, default=200, help="storage read throttle")
    p.add_argument("--page-cache-mib", type=int, default=192, help="memory for cached file pages (+ cache)")
    p.add_argument("--cache-mib", type=int, default=128, help="cg.NeighborLoader feature_cache_bytes")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated, of {','.join(MODES)}")
    p.add_argument("--json", type=Path, help="also write the raw results here")
    args = p.parse_args()
    if args.child:
        child(args)
        return
    run_all(args)


def run_all(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(HERE))
    from slowstore import SlowStore

    from coordl.graph.synth import synth_graph

    modes = [m for m in args.modes.split(",") if m]
    pyg_missing = _pyg_available() if "pyg" in modes else None
    if pyg_missing:
        modes.remove("pyg")
    feature_bytes = args.nodes * args.feature_dim * 4
    image = int(feature_bytes * 1.3) + (args.edges * 16) + (256 * MiB)
    results: dict[str, list[dict]] = {m: [] for m in modes}
    with SlowStore(
        image_bytes=image,
        read_bps=args.read_mb_per_s * 1_000_000,
        page_cache_bytes=args.page_cache_mib * MiB,
        tag="gnn",
    ) as store:
        graph_dir = Path(store.mount) / "graph"
        t0 = time.perf_counter()
        g = synth_graph(
            graph_dir,
            num_nodes=args.nodes,
            num_edges=args.edges,
            feature_dim=args.feature_dim,
            num_classes=16,
            train_fraction=args.train_fraction,
            seed=args.seed,
        )
        os.sync()
        print(f"graph: {g} in {time.perf_counter() - t0:.0f} s", flush=True)
        info = {"num_nodes": g.num_nodes, "num_edges": g.num_edges, "train": int(g.train_idx.size)}
        del g
        for run in range(args.runs):
            for mode in modes:
                has_cache = mode in ("cache", "pipe")
                store.set_page_cache_bytes((args.page_cache_mib - (args.cache_mib if has_cache else 0)) * MiB)
                store.evict()
                read0 = store.read_bytes()
                cmd = [sys.executable, __file__, "--child", mode, "--graph", str(graph_dir)]
                for flag in ("batch_size", "hidden", "workers", "depth", "epochs", "seed", "cache_mib"):
                    cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
                cmd += ["--fanouts", ",".join(map(str, args.fanouts))]
                env = dict(os.environ, PYTHONPATH=str(HERE.parent))
                out = json.loads(store.run(cmd, env=env).strip().splitlines()[-1])
                out["disk_bytes"] = store.read_bytes() - read0
                results[mode].append(out)
                ep = [round(e["time_s"], 1) for e in out["epochs"]]
                print(f"run {run} {mode}: epochs {ep} s, disk {out['disk_bytes'] / MiB:.0f} MiB", flush=True)
    if args.json:
        args.json.write_text(
            json.dumps(
                {"info": info, "args": vars(args) | {"graph": None, "json": None}, "results": results},
                indent=1,
                default=str,
            )
        )
    print_table(args, info, results, pyg_missing)


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def print_table(args: argparse.Namespace, info: dict, results: dict, pyg_missing: str | None) -> None:
    print(
        f"\nR-MAT graph: {info['num_nodes']} nodes, {info['num_edges']} edges, features {args.feature_dim} x fp32 "
        f"({info['num_nodes'] * args.feature_dim * 4 / MiB:.0f} MiB); {info['train']} seeds, batch {args.batch_size}, "
        f"fanouts {args.fanouts}, GraphSAGE hidden {args.hidden}; storage {args.read_mb_per_s} MB/s, "
        f"memory for file pages + cache {args.page_cache_mib} MiB (cache {args.cache_mib} MiB); "
        f"median of {args.runs} runs"
    )
    last = args.epochs - 1
    ref_exposed = _med([r["epochs"][last]["exposed_s"] for r in results.get("cache", [])])
    seq_time = _med([r["epochs"][last]["time_s"] for r in results.get("seq", [])])
    head = (
        f"{'mode':<6} | {'epoch 1 s':>9} | {f'epoch {last + 1} s':>9} | {'compute s':>9} | {'exposed s':>9} | "
        f"{'hidden':>6} | {'vs seq':>6} | {'hit ratio':>9} | {'disk MiB':>8}"
    )
    print(head)
    print("-" * len(head))
    for mode, runs in results.items():
        t_first = _med([r["epochs"][0]["time_s"] for r in runs])
        t_last = _med([r["epochs"][last]["time_s"] for r in runs])
        exposed = _med([r["epochs"][last]["exposed_s"] for r in runs])
        compute = _med([r["compute_per_batch_s"] * r["epochs"][last]["batches"] for r in runs])
        hidden = 1 - exposed / ref_exposed if ref_exposed == ref_exposed and ref_exposed > 0 else float("nan")
        hits = [r["stats"].get("cache_hit_ratio") for r in runs if r["stats"]]
        hit = f"{_med(hits):.1%}" if hits else "-"
        disk = _med([r["disk_bytes"] / MiB for r in runs])
        print(
            f"{mode:<6} | {t_first:9.1f} | {t_last:9.1f} | {compute:9.1f} | {exposed:9.1f} | {hidden:6.0%} | "
            f"{seq_time / t_last:5.2f}x | {hit:>9} | {disk:8.0f}"
        )
    if pyg_missing:
        print(f"pyg    | absent: {pyg_missing}")


if __name__ == "__main__":
    main()

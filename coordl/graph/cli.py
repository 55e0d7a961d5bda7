"""``coordl graph``: ``synth`` (write an R-MAT graph), ``info`` (describe one), ``demo`` (train on one).

Registered in ``coordl/cli.py`` through :func:`add_parser`; :func:`main` runs the chosen action.
A bad argument or a bad graph file ends in one line naming it and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from coordl.argtypes import int_between

__all__ = ["add_parser", "main"]


class _OneLineParser(argparse.ArgumentParser):
    """Argument errors as one line naming the argument (no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def _fanouts(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must look like 15,10, got {text!r}") from None
    if any(v == 0 or v < -1 for v in values):
        raise argparse.ArgumentTypeError(f"each fanout must be positive or -1, got {text!r}")
    return values


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``coordl graph {synth,info,demo}``."""
    p = subparsers.add_parser("graph", help="GNN graphs: synthetic R-MAT graphs, info, a GraphSAGE demo")
    sub = p.add_subparsers(dest="graph_command", required=True, parser_class=_OneLineParser)
    s = sub.add_parser("synth", help="write a power-law (R-MAT) graph with features and labels")
    s.add_argument("path", help="output graph directory")
    s.add_argument(
        "--nodes", type=int_between(2, None), default=100_000, help="number of nodes (default 100000)"
    )
    s.add_argument(
        "--edges",
        type=int_between(1, None),
        default=1_000_000,
        help="edges drawn, about the edges written (default 1000000)",
    )
    s.add_argument(
        "--feature-dim",
        type=int_between(1, None),
        default=128,
        help="float32 features per node (default 128)",
    )
    s.add_argument(
        "--classes", type=int_between(2, None), default=16, help="number of label classes (default 16)"
    )
    s.add_argument(
        "--train-fraction", type=_fraction, default=0.5, help="share of nodes in train_idx (default 0.5)"
    )
    s.add_argument(
        "--directed", action="store_true", help="keep R-MAT's directed edges (default: add reverses)"
    )
    s.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    i = sub.add_parser("info", help="print a graph's sizes and degree statistics")
    i.add_argument("path", help="graph directory (or a .pt file saved from a PyG Data)")
    d = sub.add_parser("demo", help="train a 2-layer GraphSAGE with cg.NeighborLoader for a few epochs")
    d.add_argument("--path", help="graph directory (default: a small synthetic graph in a temp directory)")
    d.add_argument("--epochs", type=int_between(1, None), default=2)
    d.add_argument("--batch-size", type=int_between(1, None), default=512)
    d.add_argument(
        "--fanouts", type=_fanouts, default=[10, 5], help="per hop, comma-separated (default 10,5)"
    )
    d.add_argument("--workers", type=int_between(0, None), default=2)
    d.add_argument(
        "--cache-mib", type=int_between(0, None), default=16, help="hot-feature cache (default 16 MiB)"
    )
    d.add_argument("--pipeline-depth", type=int_between(0, None), default=4)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Run ``coordl graph <command>``; bad input prints one line and returns 2."""
    from coordl.graph.graph import GraphFormatError

    actions = {"synth": _synth, "info": _info, "demo": _demo}
    try:
        return actions[args.graph_command](args)
    except (GraphFormatError, ValueError, MemoryError, OSError) as e:
        print(f"coordl graph {args.graph_command}: error: {e}", file=sys.stderr)
        return 2


def _synth(args: argparse.Namespace) -> int:
    from coordl.graph.synth import synth_graph

    start = time.perf_counter()
    g = synth_graph(
        args.path,
        num_nodes=args.nodes,
        num_edges=args.edges,
        feature_dim=args.feature_dim,
        num_classes=args.classes,
        train_fraction=args.train_fraction,
        undirected=not args.directed,
        seed=args.seed,
    )
    print(
        f"{args.path}: {g.num_nodes} nodes, {g.num_edges} edges, features {list(g.features.shape)} "
        f"({g.features.nbytes / 1e6:.1f} MB), {time.perf_counter() - start:.1f} s"
    )
    return 0


def _info(args: argparse.Namespace) -> int:
    import numpy as np

    from coordl.graph.graph import Graph

    g = Graph.load(args.path)
    deg = g.in_degree()
    print(repr(g))
    print(
        f"in-degree: mean {deg.mean():.1f}, median {np.median(deg):.0f}, max {deg.max()}, "
        f"isolated {(deg == 0).sum()}"
    )
    top = np.sort(np.asarray(g.out_degree))[::-1]
    share = top[: max(1, g.num_nodes // 100)].sum() / max(1, top.sum())
    print(f"the top 1% of nodes by out-degree are the source of {share:.0%} of edges")
    if g.labels is not None:
        print(f"labels: {list(g.labels.shape)} {g.labels.dtype}")
    if g.train_idx is not None:
        print(f"train_idx: {g.train_idx.size} nodes")
    return 0


def _demo(args: argparse.Namespace) -> int:
    import torch

    from coordl.graph.graph import Graph
    from coordl.graph.loader import NeighborLoader
    from coordl.graph.models import GraphSAGE
    from coordl.graph.synth import synth_graph

    with tempfile.TemporaryDirectory(prefix="coordl-graph-demo-") as tmp:
        if args.path:
            graph = Graph.load(args.path)
        else:
            graph = synth_graph(
                Path(tmp) / "g", num_nodes=50_000, num_edges=500_000, feature_dim=64, num_classes=8
            )
            print(f"synthetic graph: {graph}")
        seeds = graph.train_idx if graph.train_idx is not None else torch.arange(graph.num_nodes)
        if graph.labels is None:
            raise ValueError(f"{args.path}: the graph has no labels to train on")
        num_classes = int(graph.labels.max()) + 1
        model = GraphSAGE(int(graph.features.shape[1]), 128, num_classes, num_layers=len(args.fanouts))
        opt = torch.optim.Adam(model.parameters(), lr=5e-3)
        with NeighborLoader(
            graph,
            seeds,
            args.fanouts,
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=args.workers,
            feature_cache_bytes=args.cache_mib << 20,
            pipeline_depth=args.pipeline_depth,
            seed=0,
        ) as loader:
            for epoch in range(args.epochs):
                start, total, right, seen = time.perf_counter(), 0.0, 0, 0
                for batch in loader:
                    out = model(batch)
                    assert batch.y is not None  # the graph has labels (checked above)
                    loss = torch.nn.functional.cross_entropy(out, batch.y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    total += loss.item() * len(batch)
                    right += int((out.argmax(1) == batch.y).sum())
                    seen += len(batch)
                s = loader.stats()
                print(
                    f"epoch {epoch}: {time.perf_counter() - start:.1f} s, loss {total / seen:.3f}, "
                    f"train acc {right / seen:.1%}, cache hit ratio {s['cache_hit_ratio']:.1%}"
                )
    return 0


def _standalone(argv: list[str] | None = None) -> int:
    """``python -m coordl.graph.cli synth ...``: the same commands without ``coordl/cli.py``."""
    parser = argparse.ArgumentParser(prog="coordl")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["graph", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(_standalone())

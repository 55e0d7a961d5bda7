"""``dsanalyzer whatif REPORT --nodes N`` and ``--gpu-prep``: two of coordl's remedies as what-if axes.

* ``--nodes N`` (with ``--peer-gbps``, ``--shared-storage``): the partitioned cache over N nodes
  (``coordl.DataLoader(cache_bytes=C, partitioned=True)``), each node caching the asked cache
  (``--cache-gb``, else the measured one) and reading its share of every epoch; prints the rate per node and
  the job's aggregate; the last line is the per-node rate (:mod:`dsanalyzer.model.partitioned`).
* ``--gpu-prep``: decode and augment on the GPU (``coordl.dali.DALILoader(device="gpu")``), from the GPU
  rate the profile probed on the job's own items (:mod:`dsanalyzer.model.gpu_prep`). A profile taken
  without a GPU has none: the what-if prints "unknown without a GPU" with the probe's reason, and the
  last line stays the prediction without GPU prep.

The rest of the point (cores, workers, storage, GPU speed-up) is what the other options ask.
"""

from __future__ import annotations

import argparse
import sys

from dsanalyzer.model import gpu_prep, partitioned
from dsanalyzer.model.stages import Point
from dsanalyzer.model.whatif import Model, format_bytes

__all__ = ["add_nodes_args", "nodes_error", "print_nodes"]


def add_nodes_args(p: argparse.ArgumentParser) -> None:
    """The remedies' options on ``whatif``."""
    p.add_argument(
        "--nodes", type=int,
        help="the partitioned cache over N nodes (coordl partitioned=True), each caching --cache-gb (default: "
        "as measured); prints per node and aggregate samples/s; the last line is per node",
    )  # fmt: skip
    p.add_argument(
        "--peer-gbps", type=float,
        help=f"with --nodes: each node's link in Gbit/s, carrying the other nodes' cached items "
        f"(default {partitioned.DEFAULT_PEER_GBPS:g})",
    )  # fmt: skip
    p.add_argument(
        "--shared-storage", action="store_true",
        help="with --nodes: one storage for all nodes (an NFS server), its measured bandwidth divided among "
        "them; default: each node its own, as measured here",
    )  # fmt: skip
    p.add_argument(
        "--gpu-prep", action="store_true",
        help="decode and augment on the GPU (coordl.dali.DALILoader device='gpu'), from the profile's GPU "
        "probe; unknown when the profile had no GPU (the last line then stays the prediction without it)",
    )  # fmt: skip


def nodes_error(args: argparse.Namespace) -> bool:
    """Print what is wrong with the remedies' options, if anything; True when something is."""
    err = _options_error(args)
    if err:
        print(f"dsanalyzer whatif: error: {err}", file=sys.stderr)
    return err is not None


def _options_error(args: argparse.Namespace) -> str | None:
    if args.nodes is not None and args.nodes < 1:
        return f"--nodes must be >= 1, got {args.nodes}"
    if args.peer_gbps is not None and not args.peer_gbps > 0:
        return f"--peer-gbps must be > 0, got {args.peer_gbps:g}"
    if args.nodes is None and (args.peer_gbps is not None or args.shared_storage):
        return "--peer-gbps and --shared-storage describe the nodes of --nodes N: give --nodes too"
    if args.nodes is not None and args.gpu_prep:
        return "--nodes and --gpu-prep are predicted one at a time: give one of them"
    others = [f for f, v in (("--jobs", getattr(args, "jobs", None)), ("--sample-cache-gb", getattr(args, "sample_cache_gb", None)),
                             ("--remote-cpus", getattr(args, "remote_cpus", None))) if v is not None]  # fmt: skip
    if (args.nodes is not None or args.gpu_prep) and others:
        return f"--nodes and --gpu-prep are predicted one remedy at a time: not with {', '.join(others)}"
    return None


def print_nodes(args: argparse.Namespace, model: Model, point: Point) -> float | None:
    """Print the asked remedy's prediction at ``point``; returns the rate for the last line (None: none asked,
    or GPU prep unknown)."""
    if args.gpu_prep:
        pred = gpu_prep.predict_gpu_prep(model, point)
        if pred is None:
            print(f"\ngpu prep: {gpu_prep.unknown_reason(model)}; the last line is the prediction without it")
            return None
        print(
            f"\ngpu prep (coordl.dali.DALILoader, device='gpu'): {pred.samples_per_s:.1f} samples/s, "
            f"{pred.bound}-bound; the GPU preps at {model.gpu_prep_per_s:.0f} samples/s (probed) and "
            f"shares its time with the step ({pred.stage_rates['gpu']:.1f} samples/s for both); fetch "
            f"{pred.stage_rates['fetch']:.1f}, cores {pred.stage_rates['cpu']:.1f} samples/s"
        )
        return pred.samples_per_s
    if args.nodes is None:
        return None
    gbps = args.peer_gbps if args.peer_gbps is not None else partitioned.DEFAULT_PEER_GBPS
    pred = partitioned.predict_nodes(model, args.nodes, point, gbps * 1e9 / 8, args.shared_storage)
    sh = partitioned.shares(model.dataset_bytes, point.cache_bytes, args.nodes)
    storage = "one storage shared by the nodes" if args.shared_storage else "each node its own storage"
    print(
        f"\npartitioned cache over {args.nodes} nodes (partitioned=True, cache {format_bytes(point.cache_bytes)} "
        f"per node, {gbps:g} Gbit/s node links, {storage}): a node reads {sh.local:.0%} from its own cache, "
        f"{sh.remote:.0%} from the other nodes', {sh.storage:.0%} from storage\n"
        f"  per node: {pred.samples_per_s:.1f} samples/s, {pred.bound}-bound (fetch stage "
        f"{pred.stage_rates['fetch']:.1f}, worker cycle {pred.stage_rates['worker_cycle']:.1f}); "
        f"aggregate: {args.nodes * pred.samples_per_s:.1f} samples/s; epoch {pred.epoch_s:.1f} s"
    )
    if model.peer_item_s is None:
        print("  (a remote hit is charged its bytes over the link only: this profile did not probe Redis)")
    return pred.samples_per_s

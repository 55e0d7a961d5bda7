"""``dsanalyzer whatif REPORT --remote-cpus N``: the job with N remote CPUs of a Ray cluster added.

The model is :mod:`dsanalyzer.model.remote_prep`'s; this module adds its options to ``whatif`` and
prints its answer. ``--remote-sample-kb`` is what one sample weighs on the way back (the uint8 crop for a
recipe that ends in ToTensor + Normalize: 150.5 KB at 224 px; the float tensor otherwise; default: what
the profile measured on item 0 of a coordl loader);
``--remote-link-gbps`` the link between the trainer and the prep nodes (default: not limiting);
``--remote-ship`` when the prep nodes cannot read the dataset and the trainer sends them its bytes.
"""

from __future__ import annotations

import argparse
import math

from dsanalyzer.model.cores import worker_cpu_s
from dsanalyzer.model.rates import Prediction
from dsanalyzer.model.remote_prep import (
    RemoteSetup,
    epoch_drain_s,
    receive_cpu_s,
    remote_rate,
    with_remote,
)
from dsanalyzer.model.whatif import Model

__all__ = ["add_remote_args", "remote_point", "check_remote_args"]


def add_remote_args(p: argparse.ArgumentParser) -> None:
    """Register the remote-prep options on ``whatif``."""
    p.add_argument("--remote-cpus", type=int, help="remote CPUs of a Ray cluster prepping too (remote_prep=)")
    p.add_argument(
        "--remote-sample-kb", type=float,
        help="KB (1e3 bytes) one sample weighs coming back from a remote CPU (default: as profiled; 224 px uint8 crop: 150.5)",
    )  # fmt: skip
    p.add_argument(
        "--remote-link-gbps", type=float, help="link to the prep nodes, Gbit/s (default: not limiting)"
    )
    p.add_argument(
        "--remote-ship", action="store_true", help="the trainer sends the raw bytes (nodes cannot read)"
    )


def check_remote_args(args: argparse.Namespace, model: Model) -> str | None:
    """The error message for bad remote options (None: fine)."""
    if args.remote_cpus is None:
        given = [n for n in ("remote_sample_kb", "remote_link_gbps") if getattr(args, n) is not None]
        if given or args.remote_ship:
            return "--remote-sample-kb, --remote-link-gbps and --remote-ship need --remote-cpus"
        return None
    if getattr(args, "jobs", None) is not None or getattr(args, "sample_cache_gb", None) is not None:
        return "--remote-cpus goes with neither --jobs nor --sample-cache-gb (coordl refuses remote_prep with both)"
    if args.remote_cpus < 1:
        return f"--remote-cpus must be >= 1, got {args.remote_cpus}"
    if args.remote_sample_kb is None and not model.remote_wire_bytes:
        return (
            "--remote-cpus needs --remote-sample-kb (what one prepped sample weighs on the way back): the "
            "profile measures it only for a coordl loader whose transform ends in ToTensor + Normalize"
        )
    if args.remote_sample_kb is not None and args.remote_sample_kb <= 0:
        return f"--remote-sample-kb must be > 0, got {args.remote_sample_kb}"
    if args.remote_link_gbps is not None and args.remote_link_gbps <= 0:
        return f"--remote-link-gbps must be > 0, got {args.remote_link_gbps}"
    return None


def remote_point(
    args: argparse.Namespace, model: Model, local: Prediction, cpus: int, gpu_speedup: float
) -> Prediction:
    """The asked point with the remote CPUs added; prints how the rate splits."""
    link = args.remote_link_gbps * 1e9 / 8 if args.remote_link_gbps else math.inf
    wire = (
        args.remote_sample_kb * 1e3
        if args.remote_sample_kb is not None
        else float(model.remote_wire_bytes or 0)
    )
    setup = RemoteSetup(args.remote_cpus, wire, link, args.remote_ship)
    point = with_remote(model, local, setup, cpus, model.compute_rate(gpu_speedup))
    print(
        f"\nremote prep: {setup.cpus} remote CPU(s) at {1 / worker_cpu_s(model):.1f} samples/s each "
        f"(the profiled worker's CPU per sample, {worker_cpu_s(model) * 1e3:.2f} ms), "
        f"{remote_rate(model, setup):.1f} samples/s back with sending"
        + (f" over {args.remote_link_gbps:g} Gbit/s" if args.remote_link_gbps else "")
        + f"; each costs the trainer {receive_cpu_s(model, setup) * 1e3:.2f} ms of CPU, leaving "
        f"{point.stage_rates['local_with_remote']:.1f} samples/s of local prep (alone: {local.steady:.1f})"
    )
    drain = epoch_drain_s(model, setup, local.steady)
    if drain > 0:
        print(
            f"  at each epoch's end the remote CPUs idle {drain:.2f} s of each {point.epoch_s:.2f} s epoch "
            "(the local workers' last round, torch restarting them; a longer epoch idles a smaller share)"
        )
    return point

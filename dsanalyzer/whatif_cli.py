"""``dsanalyzer whatif REPORT``: predicted samples/s over a grid, and for one asked point.

The last line printed is always ``predicted_samples_per_s=<float>`` for the point asked (the measured
configuration, changed by whichever options are given), so that scripts can read it with ``tail -1``.
Sizes are decimal: ``--cache-gb 32`` is 32e9 bytes, ``--storage-mbps 500`` is 500e6 bytes/s.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from dsanalyzer.judge.verdict import advice_sentence, threads_note
from dsanalyzer.model import search, stages
from dsanalyzer.model.cache import POLICIES
from dsanalyzer.model.comm import CommModel
from dsanalyzer.model.rates import Prediction
from dsanalyzer.model.whatif import Model, format_bytes
from dsanalyzer.report.schema import load_report
from dsanalyzer.whatif_nodes import add_nodes_args, nodes_error, print_nodes
from dsanalyzer.whatif_remedies import add_remedy_options, print_remedy, remedy_ok
from dsanalyzer.whatif_remote import add_remote_args, check_remote_args, remote_point

__all__ = ["add_whatif_parser", "run_whatif", "load_report_file"]

_BOUND_MARK = {"compute": "C", "prep": "P", "fetch": "F"}


def load_report_file(path: str | Path) -> dict:
    """Load and check report.json (errors name the file)."""
    return load_report(path)


def add_whatif_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``whatif`` on the ``dsanalyzer`` command."""
    p = subparsers.add_parser(
        "whatif",
        help="predict samples/s for another cache size, core count, storage speed or GPU",
        description=(__doc__ or "").replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("report", help="report.json written by `dsanalyzer profile`")
    p.add_argument("--cache-gb", type=float, help="cache size in GB (1e9 bytes); default: the measured one")
    p.add_argument("--cpus", type=int, help="CPU cores for data prep; default: the measured machine's")
    p.add_argument(
        "--workers",
        type=int,
        help="loader workers (0: load in the main process); default: the measured count, or one per core with --cpus",
    )
    p.add_argument(
        "--storage-mbps", type=float, help="storage bandwidth in MB/s (1e6 bytes/s); default: measured"
    )
    p.add_argument("--gpu-speedup", type=float, default=1.0, help="compute rate multiplier (a faster GPU)")
    p.add_argument(
        "--link-gbps",
        type=float,
        help="network link speed in Gbit/s for a distributed job's all-reduce (default: as measured)",
    )
    p.add_argument(
        "--compress-ratio",
        type=float,
        default=1.0,
        help="gradient compression: bytes on the wire divided by this (e.g. gradcomp's ratio; default 1)",
    )
    p.add_argument(
        "--cache-policy", choices=POLICIES, help="pagecache (LRU) or minio; default: the measured one"
    )
    p.add_argument(
        "--fetch-ahead", type=int,
        help="a bucket's read-ahead threads per worker (coordl's fetch_ahead); default: as measured",
    )  # fmt: skip
    p.add_argument(
        "--items-per-request", type=float,
        help="items one bucket GET brings (tar shards: items per shard); default: as measured (1: loose files)",
    )  # fmt: skip
    add_remote_args(p)
    add_remedy_options(p)
    add_nodes_args(p)  # --nodes, --peer-gbps, --shared-storage, --gpu-prep
    p.add_argument("--json", action="store_true", help="print the prediction as JSON before the last line")
    p.set_defaults(func=run_whatif)
    return p


def _rate_cell(rate: float, bound: str) -> str:
    return f"{rate:>9.1f} {_BOUND_MARK.get(bound, '?')}"


def _table(
    model: Model, policy: str, storage: float, gpu: float, cpus_list: list[int], caches: Sequence[float]
) -> str:
    head = f"{'cache':>10} {'hit':>5} | " + " ".join(f"{f'{c} cpus':>11}" for c in cpus_list)
    lines = [head, "-" * len(head)]
    for cache in caches:
        cells = []
        hit = 0.0
        for c in cpus_list:
            p = model.predict(cache, c, storage, gpu_speedup=gpu, policy=policy)
            hit = p.hit_ratio
            cells.append(_rate_cell(p.samples_per_s, p.bound))
        lines.append(f"{format_bytes(cache):>10} {hit:>5.2f} | " + " ".join(cells))
    return "\n".join(lines)


def _comm_factor(report: dict, args: argparse.Namespace) -> float | None:
    """Factor on the compute rate for another link speed / compression (None after printing an error)."""
    try:
        comm = CommModel.from_report(report)
        step_s = float(report["per_iter_s"]["compute"])
        factor = comm.compute_speedup(step_s, args.link_gbps, args.compress_ratio)
    except (ValueError, KeyError, TypeError) as e:
        print(f"dsanalyzer whatif: error: {e}", file=sys.stderr)
        return None
    link = f"{args.link_gbps:g} Gbit/s" if args.link_gbps is not None else "the measured link"
    print(
        f"communication: {comm.comm_exposed_s * 1e3:.1f} ms exposed per step as measured; with {link} and "
        f"compression x{args.compress_ratio:g}: {comm.exposed_s(args.link_gbps, args.compress_ratio) * 1e3:.1f} ms "
        f"(compute rate x{factor:.3f})"
    )
    return factor


def _print_model_notes(model: Model, gpu_speedup: float) -> None:
    """What the model knows beyond the grid: a free fetch, the main process's own cost, the CPU per sample."""
    if model.fetch_free:
        print(
            "the dataset reads no files (in memory or generated): fetch is free, cache and storage do not matter"
        )
    if model.batch_overhead_s > 0:
        print(
            f"main process: {model.batch_overhead_s * 1e3:.2f} ms of its own CPU per batch receiving it "
            f"(CPU time in the in-memory run), in series with the step, caps the job at "
            f"{model.compute_rate(gpu_speedup):.1f} samples/s: the 'compute-bound' cells below are at that cap"
        )
    if model.store is not None:
        s = model.store
        print(
            f"source: a bucket, {s.latency_s * 1e3:.1f} ms round trip, {s.request_rate:,.0f} requests/s and "
            f"{format_bytes(s.bandwidth_bytes_per_s)}/s at most (as probed); measured with {model.fetch_ahead} "
            f"fetch-ahead thread(s) per worker, {model.items_per_request:g} item(s) per request; "
            "--storage-mbps sets its bandwidth"
        )
    if model.prep_cpu_s:
        print(
            f"cores: the data path costs {model.prep_cpu_s * 1e3:.2f} ms CPU per sample and the step "
            f"{(model.step_cpu_s or 0) * 1e3:.2f} ms per batch, on cores of which the job got "
            f"{model.cpu_share:.0%} while profiled"
            + ("; the step runs on the GPU, and its CPU (CUDA's wait spins) scales with --gpu-speedup"
               if not model.step_on_cpu else "")
        )  # fmt: skip


def _store_args(args: argparse.Namespace, model: Model) -> dict | None:
    """``--fetch-ahead`` and ``--items-per-request`` as predict's arguments; None (after the error) when wrong."""
    kw = {"fetch_ahead": args.fetch_ahead, "items_per_request": args.items_per_request}
    if (args.fetch_ahead is not None and args.fetch_ahead < 0) or (
        args.items_per_request is not None and args.items_per_request <= 0
    ):
        print(
            "dsanalyzer whatif: error: --fetch-ahead must be >= 0 and --items-per-request > 0",
            file=sys.stderr,
        )
        return None
    if (bad := check_remote_args(args, model)) is not None:
        print(f"dsanalyzer whatif: error: {bad}", file=sys.stderr)
        return None
    if model.store is None and any(v is not None for v in kw.values()):
        print(
            "dsanalyzer whatif: error: --fetch-ahead and --items-per-request are for a job that reads a bucket "
            "(this report's source is not one)",
            file=sys.stderr,
        )
        return None
    return kw


def _print_json(point: Prediction) -> None:
    keys = ("samples_per_s", "epoch_s", "bound", "hit_ratio", "stage_rates", "per_iter_s")
    print(json.dumps({k: getattr(point, k) for k in keys}))


def run_whatif(args: argparse.Namespace) -> int:
    """Print the grid tables, the way to compute-bound, and the asked point (last line)."""
    try:
        report = load_report_file(args.report)
        model = Model.from_report(report)
    except (ValueError, KeyError, TypeError) as e:
        print(f"dsanalyzer whatif: error: {e}", file=sys.stderr)
        return 2
    if args.link_gbps is not None or args.compress_ratio != 1.0:
        factor = _comm_factor(report, args)
        if factor is None:
            return 2
        args.gpu_speedup *= factor
    cache = args.cache_gb * 1e9 if args.cache_gb is not None else model.cache_bytes
    cpus = args.cpus if args.cpus is not None else model.cpus
    storage = args.storage_mbps * 1e6 if args.storage_mbps else model.storage_bytes_per_s
    policy = args.cache_policy or model.cache_policy
    workers = args.workers if args.workers is not None else (model.workers if args.cpus is None else None)
    if (store_kw := _store_args(args, model)) is None or not remedy_ok(args, model) or nodes_error(args):
        return 2
    bad_workers = workers is not None and workers < 0
    if cache < 0 or cpus < 1 or storage <= 0 or args.gpu_speedup <= 0 or bad_workers:
        print(
            "dsanalyzer whatif: error: --cache-gb and --workers must be >= 0, --cpus >= 1, --storage-mbps and --gpu-speedup > 0",
            file=sys.stderr,
        )
        return 2
    caches, cpus_list, _ = search.default_axes(model)
    caches = sorted(set(caches) | {round(cache)})
    cpus_list = sorted(set(cpus_list) | {cpus})
    print(
        f"dataset {model.dataset_items} items, {format_bytes(model.dataset_bytes)}; batch {model.batch_size}; "
        f"compute {model.compute_per_s * args.gpu_speedup:.1f} samples/s (the step alone); "
        f"storage {format_bytes(storage)}/s"
    )
    _print_model_notes(model, args.gpu_speedup)
    for pol in POLICIES:
        print(
            f"\nsamples/s with the {pol} cache at {format_bytes(storage)}/s (bound: C compute, P prep, F fetch)"
        )
        print(_table(model, pol, storage, args.gpu_speedup, cpus_list, caches))
    need = search.to_compute_bound(model, gpu_speedup=args.gpu_speedup)
    print(
        "\nto be compute-bound "
        f"({need['compute_samples_per_s']:.1f} samples/s): cores {need['cpus_needed'] or 'never (prep saturates)'}; "
        f"MinIO cache {format_bytes(need['cache_bytes_needed']['minio'])}; "
        f"page cache {format_bytes(need['cache_bytes_needed']['pagecache'])}; "
        f"storage {format_bytes(need['storage_bytes_per_s_needed'])}/s"
    )
    print(advice_sentence(report))
    note = threads_note(model, cpus, cpus if workers is None else workers, cache_bytes=cache,
                        storage_bytes_per_s=storage, gpu_speedup=args.gpu_speedup, policy=policy, **store_kw)  # fmt: skip
    if note:
        print(f"note: {note}")
    point = model.predict(
        cache, cpus, storage, gpu_speedup=args.gpu_speedup, policy=policy, workers=workers, **store_kw
    )
    point = point if args.remote_cpus is None else remote_point(args, model, point, cpus, args.gpu_speedup)
    print(
        f"\npoint: cache {format_bytes(cache)} ({policy}, hit ratio {point.hit_ratio:.3f}), {cpus} cpus, "
        f"storage {format_bytes(storage)}/s, gpu x{args.gpu_speedup:g}: {point.samples_per_s:.1f} samples/s, "
        f"epoch {point.epoch_s:.1f} s, {point.bound}-bound"
    )
    if args.json:
        _print_json(point)
    asked = replace(
        stages.Point(cache, cpus, storage, args.gpu_speedup, policy, cpus if workers is None else workers),
        **store_kw,
    )
    rate = print_remedy(args, model, asked)
    rate = print_nodes(args, model, asked) if rate is None else rate
    print(f"predicted_samples_per_s={point.samples_per_s if rate is None else rate:.6g}")  # or the remedy's
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``whatif`` alone (``python -m dsanalyzer.whatif_cli REPORT ...``)."""
    parser = argparse.ArgumentParser(prog="dsanalyzer")
    sub = parser.add_subparsers(dest="command", required=True)
    add_whatif_parser(sub)
    args = parser.parse_args(["whatif", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

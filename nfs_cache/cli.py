"""``coordl stage SRC DST``: copy a remote dataset into a local stage directory ahead of training.

Safe to interrupt (Ctrl-C, ``kill -9``) and re-run: files already staged are skipped, partial copies are never used.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from nfs_cache.prefetch import stage_all

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``"500M"``, ``"20G"``, ``"1048576"`` -> bytes (binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)i?[bB]?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: use e.g. 500M, 20G or a number of bytes")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "stage",
        help="copy a dataset from NFS/remote storage to a local directory (resumable)",
        description="Stage SRC (a directory, nfs://server/export/path[?version=4&nfsport=N], or an fsspec URL) "
        "into the local directory DST, the same layout coordl's read-through staging uses "
        "(ImageFolder(..., stage_dir=DST)). Interrupt and re-run at will: staged files are skipped.",
    )
    p.add_argument("src", help="dataset root: directory, nfs:// URL or fsspec URL")
    p.add_argument("dst", help="local stage directory")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="parallel copy processes (default 1: one stream fills a bandwidth-bound link; more help when "
        "per-file latency dominates, e.g. many small files on a far or busy server)",
    )
    p.add_argument(
        "--budget", type=parse_size, default=None, help="stop after this many staged bytes (e.g. 50G)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        summary = stage_all(
            args.src, args.dst, progress=not args.no_progress, workers=args.workers, budget_bytes=args.budget
        )
    except (OSError, ValueError, RuntimeError, TimeoutError, ConnectionError) as e:
        print(f"coordl stage: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary))
        return 0
    print(
        f"staged {summary['staged_files']} files ({summary['staged_bytes'] / 1e6:.1f} MB) in "
        f"{summary['seconds']:.1f} s, {summary['mb_per_s']:.1f} MB/s; "
        f"{summary['already_files']} were already staged; {summary['files']} files "
        f"({summary['bytes'] / 1e6:.1f} MB) in the dataset"
    )
    if summary["unstaged_files"]:
        print(f"{summary['unstaged_files']} files left remote (budget or disk full)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m nfs_cache.cli SRC DST``: the same as ``coordl stage`` without importing coordl (or torch)."""
    parser = argparse.ArgumentParser(prog="python -m nfs_cache.cli")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["stage", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""``coordl stage SRC DST``: copy a remote dataset into a local stage directory ahead of training.

Safe to interrupt (Ctrl-C, ``kill -9``) and re-run: files already staged are skipped, partial copies are never used.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from nfs_cache.bulk import stage_all
from nfs_cache.layout import StageDirError
from nfs_cache.sources import open_source

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``"500M"``, ``"20G"``, ``"1048576"`` -> bytes (binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)i?[bB]?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: use e.g. 500M, 20G or a number of bytes")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _workers(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "stage",
        help="copy a dataset from NFS/remote storage to a local directory (resumable)",
        description="Stage SRC (a directory, nfs://server/export/path[?version=4&nfsport=N], or an fsspec URL) "
        "into the local directory DST, which mirrors SRC (bookkeeping hidden in DST/.coordl/): once complete, "
        "coordl.ImageFolder(DST) loads it; while partial, use coordl.ImageFolder(SRC, stage_dir=DST). "
        "Interrupt and re-run at will: staged files are skipped.",
    )
    p.add_argument("src", help="dataset root: directory, nfs:// URL or fsspec URL")
    p.add_argument("dst", help="local stage directory (new, empty, or one this command staged into before)")
    p.add_argument(
        "--workers",
        type=_workers,
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


def _error(message: str) -> int:
    print(f"coordl stage: error: {message}", file=sys.stderr)
    return 1


def run(args: argparse.Namespace) -> int:
    try:
        source = open_source(args.src)
    except (OSError, ValueError) as e:
        return _error(f"argument src: {e}")
    try:
        summary = stage_all(
            source, args.dst, progress=not args.no_progress, workers=args.workers, budget_bytes=args.budget
        )
    except StageDirError as e:
        return _error(f"argument dst: {e}")
    except (OSError, ValueError, RuntimeError) as e:  # TimeoutError and ConnectionError are OSErrors
        return _error(str(e))
    if args.json:
        print(json.dumps(summary))
        return 0
    print(
        f"staged {summary['staged_files']} files ({summary['staged_bytes'] / 1e6:.1f} MB) in "
        f"{summary['seconds']:.1f} s, {summary['mb_per_s']:.1f} MB/s; "
        f"{summary['already_files']} were already staged; {summary['files']} files "
        f"({summary['bytes'] / 1e6:.1f} MB) in the dataset"
    )
    if not summary["unstaged_files"]:
        print(f"complete: coordl.ImageFolder({args.dst!r}) reads the staged copy")
        return 0
    reason = summary.get("stopped") or "budget or disk full"
    print(
        f"{summary['unstaged_files']} files left remote ({reason}): the stage is partial, "
        f"read it as coordl.ImageFolder({args.src!r}, stage_dir={args.dst!r})"
    )
    if args.budget is not None and reason.startswith("budget"):
        return 0  # what was asked for: stage up to the budget
    return _error(
        f"{args.dst}: {reason}; {summary['unstaged_files']} files were not staged (free space there)"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m nfs_cache.cli SRC DST``: the same as ``coordl stage`` without importing coordl (or torch)."""
    parser = argparse.ArgumentParser(prog="python -m nfs_cache.cli")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["stage", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("coordl stage: interrupted (run it again to resume)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

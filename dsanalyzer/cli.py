"""The ``dsanalyzer`` command: ``profile``, ``whatif``, ``demo``.

dsanalyzer profile --iters 100 -- python train.py --data /data/train -b 64
dsanalyzer whatif reports/runs/<run>/report.json --cache-gb 32 --cpus 16 --storage-mbps 500
dsanalyzer demo
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["build_parser", "main"]


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _run_profile(args: argparse.Namespace) -> int:
    from dsanalyzer.profiler import profile_command
    from dsanalyzer.report import summary_text

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print(
            "dsanalyzer profile: give the training command after `--`, "
            "e.g. dsanalyzer profile -- python train.py",
            file=sys.stderr,
        )
        return 2
    report = profile_command(
        command,
        out_dir=args.out,
        iters=args.iters,
        warmup=args.warmup,
        data_path=args.data,
        timeout_s=args.timeout,
        show_progress=not args.quiet,
    )
    out = report.pop("_out_dir")
    print(summary_text(report))
    print(f"report: {out}/report.json  {out}/report.html")
    return 0


def _run_demo(args: argparse.Namespace) -> int:
    from dsanalyzer.demo import run_demo

    return run_demo(out_dir=args.out, items=args.items, iters=args.iters, quiet=args.quiet)


def add_profile_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile",
        help="measure compute, prep stall and fetch stall of an unmodified training command",
        description="Runs the command four times (step alone; loader alone at 1..cores workers; data in "
        "memory; cold cache), each stopped after --warmup + --iters iterations, and writes report.json "
        "and report.html.",
    )
    p.add_argument(
        "--iters", type=_positive_int, default=100, help="measured iterations per run (default 100)"
    )
    p.add_argument(
        "--warmup", type=int, default=5, help="iterations dropped at the start of each run (default 5)"
    )
    p.add_argument("--out", help="output directory (default reports/runs/<time>-<script>)")
    p.add_argument(
        "--data", help="the dataset's directory, when the loader's dataset does not list its files"
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per run (default 600)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the training command")
    p.set_defaults(func=_run_profile)


def add_demo_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="profile a small model on a synthetic image dataset, full report")
    p.add_argument("--out", help="output directory (default reports/runs/<time>-demo)")
    p.add_argument("--items", type=_positive_int, default=1500, help="synthetic JPEGs (default 1500)")
    p.add_argument("--iters", type=_positive_int, default=60, help="measured iterations per run (default 60)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_run_demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dsanalyzer", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="subcommand", required=True)
    add_profile_parser(sub)
    try:
        from dsanalyzer.whatif_cli import add_whatif_parser
    except ImportError as e:  # the what-if model is a separate module; profile still works without it
        print(f"dsanalyzer: whatif unavailable: {e}", file=sys.stderr)
    else:
        add_whatif_parser(sub)
    add_demo_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from dsanalyzer.profiler import ProfileError
    from dsanalyzer.report import ReportError

    try:
        return int(args.func(args) or 0)
    except (ProfileError, ReportError) as e:
        print(f"dsanalyzer: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

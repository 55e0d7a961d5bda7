"""The ``dsanalyzer`` command: ``profile``, ``whatif``, ``verify``, ``fix``, ``demo``.

dsanalyzer profile --iters 100 -- python train.py --data /data/train -b 64
dsanalyzer fix -- python train.py --data /data/train -b 64
dsanalyzer whatif reports/runs/<run>/report.json --cache-gb 32 --cpus 16 --storage-mbps 500
dsanalyzer demo
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["build_parser", "main", "plain_text"]


def plain_text(doc: str | None) -> str:
    """A docstring as --help shows it: reST's double back-quotes dropped."""
    return (doc or "").replace("``", "")


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (naming the argument) instead of usage + error; exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def _positive_int(text: str) -> int:
    value = _int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def _run_profile(args: argparse.Namespace) -> int:
    from dsanalyzer.profiler import profile_command
    from dsanalyzer.report.text import summary_text

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
        page_cache_bytes=None if args.page_cache_gb is None else int(args.page_cache_gb * 1e9),
        min_seconds=args.min_seconds,
        trace=args.trace,
    )
    out = report.pop("_out_dir")
    print(summary_text(report))
    print(f"report: {out}/report.json  {out}/report.html" + (f"  {out}/trace.json" if args.trace else ""))
    return 0


def _run_verify(args: argparse.Namespace) -> int:
    from dsanalyzer.report.text import verify_text
    from dsanalyzer.verify import verify_command

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("dsanalyzer verify: give the changed training command after `--`", file=sys.stderr)
        return 2
    v = verify_command(
        args.report,
        command,
        iters=args.iters,
        warmup=args.warmup,
        timeout_s=args.timeout,
        show_progress=not args.quiet,
        runs=args.runs,
        min_seconds=args.min_seconds,
        baseline=args.baseline,
    )
    print(verify_text(v))
    return 0


def add_verify_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        usage="dsanalyzer verify [options] REPORT -- COMMAND ...",
        help="run the changed job and show its samples/s beside the report's prediction",
        description="Runs the command (--runs times) from a cold cache (warm-up: one epoch, so a new cache fills), "
        "predicts the configuration its loader actually used from REPORT's model, and adds both numbers "
        "to REPORT (report.json and report.html) under verify.",
    )
    p.add_argument("report", help="report.json (or its directory) written by dsanalyzer profile")
    p.add_argument("--iters", type=_positive_int, default=60, help="measured iterations (default 60)")
    p.add_argument(
        "--warmup",
        type=_non_negative_int,
        help="iterations dropped first (default: one epoch + the profile's warm-up)",
    )
    p.add_argument(
        "--runs",
        type=_positive_int,
        default=1,
        help="run the job N times and compare the median (default 1; 3 on a shared or noisy machine)",
    )
    p.add_argument(
        "--baseline",
        action="store_true",
        help="before each run, run the profiled command too and judge the prediction scaled by how far "
        "it moved since the profile (a shared or noisy machine)",
    )
    p.add_argument("--timeout", type=_positive_float, default=600.0, help="seconds allowed (default 600)")
    _add_min_seconds(p)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_run_verify, command=[])


def _run_fix(args: argparse.Namespace) -> int:
    import json

    from dsanalyzer.fix import fix_command
    from dsanalyzer.report.fixtext import fix_text

    command = list(args.command)
    if not command:
        print("dsanalyzer fix: give the training command after `--`, e.g. dsanalyzer fix -- python train.py",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.online:
        return _run_fix_online(args, command)
    force = None
    if args.force_step:
        try:
            force = json.loads(args.force_step)
        except ValueError as e:
            print(f"dsanalyzer fix: error: --force-step is not JSON: {e}", file=sys.stderr)
            return 2
    result = fix_command(
        command, out_dir=args.out, report_path=args.report, profile_iters=args.profile_iters, iters=args.iters,
        warmup=args.warmup, runs=args.runs, min_seconds=args.min_seconds, rounds=args.rounds,
        timeout_s=args.timeout, show_progress=not args.quiet, dry_run=args.dry_run, force_step=force,
    )  # fmt: skip
    print(fix_text(result))
    print(f"report: {result['report']}")
    print(f"fix: {result['path']}")
    return 0


def _run_fix_online(args: argparse.Namespace, command: list[str]) -> int:
    from dsanalyzer.fix_online import fix_online
    from dsanalyzer.report.fixtext import fix_text

    if args.dry_run or args.force_step:
        print("dsanalyzer fix: error: --online runs the job to find its plan: --dry-run needs the profile's plan "
              "(drop --online)", file=sys.stderr)  # fmt: skip
        return 2
    result = fix_online(command, out_dir=args.out, report_path=args.report, epochs=args.epochs,
                        timeout_s=args.timeout, show_progress=not args.quiet)  # fmt: skip
    print(fix_text(result))
    print(f"fix: {result['path']}")
    return 0


def add_fix_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fix",
        usage="dsanalyzer fix [options] -- COMMAND ...",
        help="profile, apply the remedy that removes the stall to the unmodified script, measure, repeat",
        description="Profiles the command, then runs it with the cheapest remedy that removes the stall on this "
        "machine (the trainer's intra-op threads, num_workers, coordl.DataLoader's cache or read-ahead) applied "
        "through the import hook, measured beside your own configuration; keeps it only if it measured faster, "
        "then takes the next step while another bound binds. Prints one table and the change to keep as a patch. "
        "--online: no profile; one run of the job whose loader tunes its workers, prefetch_factor and the "
        "trainer's threads at each epoch's start (coordl.DataLoader(tune=True)), kept only where measured faster.",
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan without running it")
    p.add_argument("--online", action="store_true",
                   help="no profile: one run of the job with its loader tuning itself (coordl.DataLoader(tune=True)), "
                   "stopped once the tuner has nothing left to try; for jobs whose epochs last seconds to minutes")  # fmt: skip
    p.add_argument("--epochs", type=_positive_int, default=8,
                   help="with --online: the most epochs the run may last (default 8)")  # fmt: skip
    p.add_argument("--rounds", type=_positive_int, default=3, help="most changes to try (default 3)")
    p.add_argument("--report", help="an existing profile (report.json or its directory) instead of profiling")
    p.add_argument("--out", help="output directory of the profile (default reports/runs/<time>-<script>)")
    p.add_argument("--profile-iters", type=_positive_int, default=100,
                   help="measured iterations per profile run (default 100)")  # fmt: skip
    p.add_argument(
        "--iters", type=_positive_int, default=60, help="measured iterations per fix run (default 60)"
    )
    p.add_argument("--warmup", type=_non_negative_int,
                   help="iterations dropped first in each fix run (default: one epoch + the profile's warm-up)")  # fmt: skip
    p.add_argument("--runs", type=_positive_int, default=1,
                   help="runs of each configuration, compared by their median (default 1; 3 on a shared machine)")  # fmt: skip
    p.add_argument(
        "--timeout", type=_positive_float, default=600.0, help="seconds allowed per run (default 600)"
    )
    p.add_argument("--force-step", help=argparse.SUPPRESS)  # test-only: round 1 runs this change (JSON)
    _add_min_seconds(p)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_run_fix, command=[])


def _add_min_seconds(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--min-seconds",
        type=_non_negative_float,
        default=0.0,
        help="measure each run for at least this long, past --iters if need be (default 0; "
        "10 on a shared machine, where a run of 2 s is noise)",
    )


def _run_demo(args: argparse.Namespace) -> int:
    from dsanalyzer.demo import run_demo

    return run_demo(
        out_dir=args.out,
        items=args.items,
        iters=args.iters,
        quiet=args.quiet,
        storage_mbps=args.storage_mbps,
        verify_runs=args.verify_runs,
        min_seconds=args.min_seconds,
        step_ms=args.step_ms,
    )


def add_profile_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile",
        usage="dsanalyzer profile [options] -- COMMAND ...",
        help="measure compute, prep stall and fetch stall of an unmodified training command",
        description="Runs the command four times (step alone; loader alone at 1..cores workers; data in "
        "memory; cold cache), each stopped after --warmup + --iters iterations, and writes report.json "
        "and report.html.",
    )
    p.add_argument(
        "--iters", type=_positive_int, default=100, help="measured iterations per run (default 100)"
    )
    p.add_argument(
        "--warmup",
        type=_non_negative_int,
        default=5,
        help="iterations dropped at the start of each run (default 5)",
    )
    p.add_argument("--out", help="output directory (default reports/runs/<time>-<script>)")
    p.add_argument(
        "--data", help="the dataset's directory, when the loader's dataset does not list its files"
    )
    p.add_argument(
        "--timeout", type=_positive_float, default=600.0, help="seconds allowed per run (default 600)"
    )
    p.add_argument(
        "--page-cache-gb",
        type=_non_negative_float,
        help="page cache the job may use, in GB (a shared server's share; default: the memory available now)",
    )
    _add_min_seconds(p)
    p.add_argument(
        "--trace",
        action="store_true",
        help="also write trace.json: the real run's timeline for Perfetto / chrome://tracing",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_run_profile, command=[])


def add_demo_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="profile a small model on a synthetic image dataset, full report")
    p.add_argument("--out", help="output directory (default reports/runs/<time>-demo)")
    p.add_argument("--items", type=_positive_int, default=1500, help="synthetic JPEGs (default 1500)")
    p.add_argument("--iters", type=_positive_int, default=60, help="measured iterations per run (default 60)")
    p.add_argument(
        "--storage-mbps",
        type=_positive_float,
        default=1.5,
        help="the emulated storage's read rate in MB/s (default 1.5: slow enough for a fetch stall)",
    )
    p.add_argument(
        "--verify-runs",
        type=_positive_int,
        default=3,
        help="runs of the fixed job, compared by their median (default 3: one run is noise on a shared machine)",
    )
    p.add_argument(
        "--min-seconds",
        type=_non_negative_float,
        default=10.0,
        help="measure each run for at least this long (default 10)",
    )
    p.add_argument(
        "--step-ms",
        type=_non_negative_float,
        help="the emulated accelerator's step in ms (default: the GPU if there is one, else 30 ms "
        "emulated; 0 runs the CNN on the CPU beside the loader's workers)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_run_demo)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dsanalyzer",
        description=plain_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="subcommand", required=True)
    add_profile_parser(sub)
    try:
        from dsanalyzer.whatif_cli import add_whatif_parser
    except ImportError as e:  # the what-if model is a separate module; profile still works without it
        print(f"dsanalyzer: whatif unavailable: {e}", file=sys.stderr)
    else:
        add_whatif_parser(sub)
    add_verify_parser(sub)
    add_fix_parser(sub)
    add_demo_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first `--` is the training command: options may come before or after the
    # report argument (argparse's REMAINDER alone would swallow `verify REPORT --iters 5 -- ...`).
    command = argv[argv.index("--") + 1 :] if "--" in argv else None
    args = build_parser().parse_args(argv[: argv.index("--")] if command is not None else argv)
    if command is not None:
        if not hasattr(args, "command"):
            print(f"dsanalyzer {args.subcommand}: error: takes no command after `--`", file=sys.stderr)
            return 2
        args.command = command
    from dsanalyzer.profiler import ProfileError
    from dsanalyzer.report.schema import ReportError

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

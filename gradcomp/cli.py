"""The ``gradcomp`` command: ``gradcomp train`` (the reference trainer; run it under torchrun).

Bad arguments end with one line naming the option at fault and exit status 2, never a traceback: every value
is checked while parsing (ranges, the model name, that ``--data`` is a directory), before any process group.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import NoReturn

from gradcomp.methods import NAMES

__all__ = ["build_parser", "main"]

PLANS = ("auto", "always", "never")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the full usage is a screen long): the message names the option."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(kind: Callable[[str], float], low: float, high: float | None = None, low_open: bool = False):
    """An argparse ``type`` that parses with ``kind`` and checks ``low <= value (<= high)``."""

    def check(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {text!r}") from None
        too_low = value <= low if low_open else value < low
        if too_low or (high is not None and value > high):
            bound = f"{'>' if low_open else '>='} {low:g}" + (f" and <= {high:g}" if high is not None else "")
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    check.__name__ = kind.__name__
    return check


def _model(text: str) -> str:
    from gradcomp.models import parse_model_name

    try:
        parse_model_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _data(text: str) -> str:
    if text != "tensors" and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a directory (an ImageFolder root) nor 'tensors'")
    return text


_POSITIVE = _number(int, 1)
_COUNT = _number(int, 0)


def _add_method_options(p: argparse.ArgumentParser, baselines: tuple[str, ...]) -> None:
    g = p.add_argument_group("gradient synchronisation")
    g.add_argument("--compressor", default="mstopk", choices=NAMES,
                   help="compression method (docs/gradcomp.md lists what each sends; default mstopk)")  # fmt: skip
    g.add_argument("--ratio", type=_number(float, 0.0, 1.0, low_open=True), default=0.01,
                   help="density kept by sparsifiers, in (0, 1] (default 0.01)")  # fmt: skip
    g.add_argument("--plan", default="auto", choices=PLANS,
                   help="auto: compress a bucket only where a cost model fitted on this link predicts a gain; "
                        "always / never: every bucket compressed / dense (default auto)")  # fmt: skip
    g.add_argument("--no-error-feedback", action="store_true",
                   help="turn error feedback off (biased methods such as top-k then converge worse)")  # fmt: skip
    g.add_argument("--baseline", choices=baselines, default=None,
                   help="PyTorch's own comm hook instead of gradcomp, timed the same way")  # fmt: skip
    g.add_argument("--powersgd-rank", type=_POSITIVE, default=2,
                   help="rank of PowerSGD's factors (powersgd and --baseline torch-powersgd; default 2)")  # fmt: skip
    g.add_argument("--warmup-iters", type=_COUNT, default=10, help="dense steps before PowerSGD starts")
    g.add_argument("--bucket-cap-mb", type=_number(float, 0.0, low_open=True), default=25.0,
                   help="DDP's bucket size in MB: the unit each compression decision applies to (default 25)")  # fmt: skip
    g.add_argument("--pto", action="store_true", help="partition the optimizer step across ranks (PTO)")
    g.add_argument("--backend", default="gloo", choices=("gloo", "nccl"),
                   help="torch.distributed backend: gloo (CPU) or nccl (GPUs; default gloo)")  # fmt: skip


def _add_data_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("data and model")
    g.add_argument("--data", type=_data, default=None,
                   help="ImageFolder root; default: a synthetic JPEG set made on the spot; 'tensors': in memory")  # fmt: skip
    g.add_argument("--samples", type=_POSITIVE, default=2048, help="size of the synthetic dataset")
    g.add_argument("--classes", type=_POSITIVE, default=10, help="classes of the synthetic dataset")
    g.add_argument("--image-size", type=_POSITIVE, default=32,
                   help="side of the (square) training images in pixels (default 32)")  # fmt: skip
    g.add_argument("--signal", type=_number(float, 0.0), default=0.5,
                   help="--data tensors: class-pattern amplitude over unit noise (lower is harder)")  # fmt: skip
    g.add_argument("--model", type=_model, default="small",
                   help="small (a 60 K-parameter CNN), vgg or vgg:<hidden> (large FC layers; default small)")  # fmt: skip
    g.add_argument("--batch-size", type=_POSITIVE, default=32, help="samples per rank per step")
    g.add_argument("--iters", type=_POSITIVE, default=100, help="training steps (the cap when --target-acc)")
    g.add_argument("--lr", type=_number(float, 0.0, low_open=True), default=0.05,
                   help="SGD learning rate (momentum 0.9)")  # fmt: skip
    g.add_argument("--workers", type=_COUNT, default=1,
                   help="loader worker processes per rank (ignored for --data tensors)")  # fmt: skip
    g.add_argument("--seed", type=int, default=0, help="seed of the model, the data and the sampler")


def _add_eval_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("evaluation and report")
    g.add_argument("--eval-every", type=_COUNT, default=0,
                   help="evaluate on a held-out set every N iterations (0: off; 10 when --target-acc is set)")  # fmt: skip
    g.add_argument("--eval-samples", type=_POSITIVE, default=512,
                   help="size of the held-out set (split across ranks)")  # fmt: skip
    g.add_argument("--target-acc", type=_number(float, 0.0), default=None,
                   help="stop (all ranks) when held-out accuracy first reaches this; --iters is the cap")  # fmt: skip
    g.add_argument("--warmup-report", type=_COUNT, default=5, help="iterations left out of the medians")
    g.add_argument("--report", default="reports/runs/gradcomp-train.json",
                   help="JSON report path, written by rank 0 ('' to write none)")  # fmt: skip
    g.add_argument("--quiet", action="store_true", help="do not print the summary table")


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    from gradcomp.train import BASELINES

    p = sub.add_parser(
        "train",
        help="train a small CNN data-parallel, recording data, compute and comm time",
        description="Data-parallel training with compressed gradient sync (run one process per rank under "
        "torchrun; alone it is a world of one). Rank 0 writes a JSON report.",
    )
    _add_method_options(p, BASELINES)
    _add_data_options(p)
    _add_eval_options(p)
    p.set_defaults(func=_train)


def _train(args: argparse.Namespace) -> int:
    from gradcomp.train import train

    train(args)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gradcomp", description="compressed gradient synchronisation")
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_parser(sub)
    return parser


def _check_environment(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Argument combinations that parse but cannot run here."""
    if getattr(args, "backend", None) == "nccl":
        import torch

        if not torch.cuda.is_available():
            parser.error("argument --backend: nccl needs CUDA GPUs and none is visible; use gloo")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_environment(parser, args)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _exit(code: int) -> None:
    """Leave without running libtorch's exit-time destructors.

    A finished run occasionally aborted at interpreter exit ("terminate called without an active exception",
    SIGABRT, about 1 in 50 runs on a loaded 2-core machine) after its report was written: a C++ thread object
    torn down during finalisation. Python's own cleanup (atexit handlers: coordl's shared-memory unlinking,
    buffered output) still runs; only the C++ teardown is skipped.
    """
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())

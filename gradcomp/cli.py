"""The ``gradcomp`` command: ``gradcomp train`` (the reference trainer; run it under torchrun)."""

from __future__ import annotations

import argparse
import sys

from gradcomp.compressors import NAMES


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    from gradcomp.train import BASELINES

    p = sub.add_parser("train", help="train a small CNN data-parallel, recording data, compute and comm time")
    p.add_argument("--compressor", default="mstopk", choices=NAMES)
    p.add_argument("--ratio", type=float, default=0.01, help="density kept by sparsifiers (default 0.01)")
    p.add_argument("--plan", default="auto", choices=("auto", "always", "never"))
    p.add_argument("--no-error-feedback", action="store_true", help="turn error feedback off")
    p.add_argument(
        "--baseline", choices=BASELINES, default=None, help="PyTorch's own hook instead of gradcomp"
    )
    p.add_argument("--powersgd-rank", type=int, default=2)
    p.add_argument("--warmup-iters", type=int, default=10, help="dense steps before PowerSGD starts")
    p.add_argument("--data", default=None,
                   help="ImageFolder root; default: a synthetic JPEG set made on the spot; 'tensors': in memory")  # fmt: skip
    p.add_argument("--samples", type=int, default=2048, help="size of the synthetic dataset")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--model", default="small", help="small, vgg or vgg:<hidden>")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--workers", type=int, default=1, help="loader worker processes per rank")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--pto", action="store_true", help="partition the optimizer step across ranks")
    p.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--signal", type=float, default=0.5,
                   help="--data tensors: class-pattern amplitude over unit noise (lower is harder)")  # fmt: skip
    p.add_argument("--eval-every", type=int, default=0,
                   help="evaluate on a held-out set every N iterations (0: off; 10 when --target-acc is set)")  # fmt: skip
    p.add_argument(
        "--eval-samples", type=int, default=512, help="size of the held-out set (split across ranks)"
    )
    p.add_argument("--target-acc", type=float, default=None,
                   help="stop (all ranks) when held-out accuracy first reaches this; --iters is the cap")  # fmt: skip
    p.add_argument("--warmup-report", type=int, default=5, help="iterations left out of the medians")
    p.add_argument("--report", default="reports/runs/gradcomp-train.json", help="JSON report path (rank 0)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_train)


def _train(args: argparse.Namespace) -> int:
    from gradcomp.train import train

    train(args)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gradcomp", description="compressed gradient synchronisation")
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
    import os

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())

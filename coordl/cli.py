"""The ``coordl`` command: ``coordl synth``, ``crop-index``, ``demo``, ``stage``, ``pack`` and ``graph``.

Each subcommand lives in the module that owns the feature and registers itself through an
``add_parser(subparsers)`` function that sets ``func`` on its parser. Only the module of the
subcommand being run is imported, so ``coordl stage`` does not pay for importing torch.

Errors are one line, never a traceback: a bad argument is argparse's usage plus
``coordl SUBCMD: error: argument --x: ...`` (exit 2); a failure while running (a file in the
way, a full disk, a dead worker) is ``coordl SUBCMD: error: ...`` (exit 1). ``COORDL_DEBUG=1``
shows the traceback instead, for a bug report.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

__all__ = ["main", "build_parser"]


def _add_synth(sub: argparse._SubParsersAction) -> None:
    from coordl.datasets import synth

    synth.add_parser(sub)


def _add_crop_index(sub: argparse._SubParsersAction) -> None:
    from coordl.prep import cropindex

    cropindex.add_parser(sub)


def _add_demo(sub: argparse._SubParsersAction) -> None:
    from coordl import demo

    demo.add_parser(sub)


def _add_stage(sub: argparse._SubParsersAction) -> None:
    from nfs_cache import cli

    cli.add_parser(sub)


def _add_pack(sub: argparse._SubParsersAction) -> None:
    from coordl.packing import pack

    pack.add_parser(sub)


def _add_graph(sub: argparse._SubParsersAction) -> None:
    from coordl.graph import cli

    cli.add_parser(sub)


# subcommand -> registers it (imports only that subcommand's module)
_SUBCOMMANDS: dict[str, Callable[[argparse._SubParsersAction], None]] = {
    "synth": _add_synth,
    "crop-index": _add_crop_index,
    "demo": _add_demo,
    "stage": _add_stage,
    "pack": _add_pack,
    "graph": _add_graph,
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coordl", description="coordl: remove data stalls in training")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, add in _SUBCOMMANDS.items():
        if only is None or name == only:
            add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    only = argv[0] if argv and argv[0] in _SUBCOMMANDS else None
    args = build_parser(only).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"coordl {args.command}: interrupted", file=sys.stderr)
        return 130
    except (OSError, ValueError, RuntimeError) as e:  # CoordlError is a RuntimeError
        if os.environ.get("COORDL_DEBUG"):
            raise
        print(f"coordl {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""The ``coordl`` command: ``coordl synth``, ``coordl demo``, ``coordl stage``.

Each subcommand lives in the module that owns the feature and registers itself through an
``add_parser(subparsers)`` function that sets ``func`` on its parser.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# (module, description): a module that is absent (optional part not installed) is skipped.
_SUBCOMMANDS = ["coordl.synth", "coordl.demo", "nfs_cache.cli"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coordl", description="coordl: remove data stalls in training")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _SUBCOMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

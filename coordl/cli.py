"""The ``coordl`` command: ``coordl synth``, ``coordl demo``, ``coordl stage``.

Each subcommand lives in the module that owns the feature and registers itself through an
``add_parser(subparsers)`` function that sets ``func`` on its parser. Only the module of the
subcommand being run is imported, so ``coordl stage`` does not pay for importing torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module that defines it; a module that is absent (optional part) is skipped.
_SUBCOMMANDS = {"synth": "coordl.synth", "demo": "coordl.demo", "stage": "nfs_cache.cli"}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coordl", description="coordl: remove data stalls in training")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module_name in _SUBCOMMANDS.items():
        if only is not None and name != only:
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise
            continue
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    only = argv[0] if argv and argv[0] in _SUBCOMMANDS else None
    args = build_parser(only).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""Loaded by Python at start-up when ``dsanalyzer profile`` puts this directory on PYTHONPATH.

It installs dsanalyzer's loader-timing import hook (only when ``DSANALYZER_MODE`` is set), then runs
the ``sitecustomize`` this file shadows, if there is one further down ``sys.path``, so that the
profiled environment behaves as it would without us.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _install() -> None:
    try:
        from dsanalyzer.intercept import install_from_env
    except ImportError as e:  # the profiled interpreter cannot import dsanalyzer: say so, run unprofiled
        sys.stderr.write(f"dsanalyzer: cannot load the profiling hook in {sys.executable}: {e}\n")
        return
    install_from_env()


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_dsanalyzer_chained_sitecustomize"] = module
    spec.loader.exec_module(module)


_install()
_chain()

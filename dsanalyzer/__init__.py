"""dsanalyzer: find out whether a training job waits for compute, data prep or storage, and by how much.

    dsanalyzer profile -- python train.py --data /data/train      # an unmodified script
    report = dsanalyzer.profile(make_loader, train_step, iters=100)  # or from Python

Both run DS-Analyzer's differential measurement (step alone, prep with data in memory, the real run
with a cold cache) and write report.json / report.html; ``dsanalyzer whatif`` predicts other setups.
Names are imported lazily so that the import hook stays cheap in profiled processes.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "profile": "dsanalyzer.profiler",
    "ProfileError": "dsanalyzer.profiler",
    "load_report": "dsanalyzer.report",
    "ReportError": "dsanalyzer.report",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dsanalyzer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__

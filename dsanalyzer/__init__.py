"""dsanalyzer: find out whether a training job waits for compute, data prep or storage, and by how much.

    dsanalyzer profile -- python train.py --data /data/train      # an unmodified script
    report = dsanalyzer.profile(make_loader, train_step, iters=100)  # or from Python

Both run DS-Analyzer's differential measurement (step alone, prep with data in memory, the real run
with a cold cache) and write report.json / report.html; ``dsanalyzer whatif`` predicts other setups.
Names are imported lazily so that the import hook stays cheap in profiled processes. coordl is
optional: dsanalyzer imports it only for a loader that is a ``coordl.DataLoader``.
"""

from __future__ import annotations

from shmem.lazy import lazy_exports

_LAZY = {
    "profile": "dsanalyzer.profiler",
    "ProfileError": "dsanalyzer.profiler",
    "load_report": "dsanalyzer.report.schema",
    "ReportError": "dsanalyzer.report.schema",
}

__getattr__, __dir__, __all__ = lazy_exports("dsanalyzer", globals(), _LAZY)

"""The sections of ``scripts/gpu_check.py``: one module per GPU claim, each run in its own process.

Every section module has ``TITLE`` (the report's heading), ``BUDGET_S`` (its share of the 9 minutes)
and ``run(ctx)``, which records tables and notes on a :class:`gpu.common.Context`. ``--dry-run`` runs
the same code on the CPU with tiny sizes, so CI proves the wiring (imports, arguments, the report)
without CUDA. See docs/gpu.md.
"""

#: section name -> module under scripts/gpu/, in the order they run (short and sure first: a run cut
#: short by its time budget still has them)
SECTIONS = {
    "tests": "tests",
    "gradcomp": "compress",
    "pin": "pin",
    "dali": "dali",
    "limit": "limit",
    "cores": "cores",
    "dsanalyzer": "dsanalyzer_fix",
    "whatif": "whatif",
}

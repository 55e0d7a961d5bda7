"""gradcomp: compressed gradient synchronisation for ``DistributedDataParallel``, on where it pays.

    model = torch.nn.parallel.DistributedDataParallel(model)
    gradcomp.register(model, compressor="mstopk", ratio=0.01, error_feedback=True, plan="auto")

``register``, ``mstopk``, ``topk`` and ``recall`` are imported eagerly: they share their names with their modules,
and a lazy lookup would hand back the module once anything imported it. The rest is imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from gradcomp.mstopk import mstopk, recall, topk
from gradcomp.register import register

_LAZY = {
    "get_compressor": "gradcomp.compressors",
    "GradcompState": "gradcomp.hooks",
    "gradcomp_hook": "gradcomp.hooks",
    "ResidualMemory": "gradcomp.memory",
    "PowerSGDReducer": "gradcomp.powersgd",
    "PartitionedOptimizer": "gradcomp.pto",
    "Planner": "gradcomp.planner",
    "compressors": "gradcomp.compressors",
    "collectives": "gradcomp.collectives",
    "planner": "gradcomp.planner",
}

__all__ = sorted(_LAZY) + ["mstopk", "recall", "register", "topk"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gradcomp' has no attribute {name!r}")
    mod = importlib.import_module(module)
    value = mod if module.endswith("." + name) else getattr(mod, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__

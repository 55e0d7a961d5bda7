"""gradcomp: compressed gradient synchronisation for ``DistributedDataParallel``, on where it pays.

    model = torch.nn.parallel.DistributedDataParallel(model)
    gradcomp.register(model, compressor="mstopk", ratio=0.01, error_feedback=True, plan="auto")

``register``, ``mstopk``, ``topk`` and ``recall`` are imported eagerly: they share their names with their modules,
and a lazy lookup would hand back the module once anything imported it. The rest is imported on first use.
"""

from __future__ import annotations

from gradcomp.mstopk import mstopk as mstopk
from gradcomp.mstopk import recall as recall
from gradcomp.mstopk import topk as topk
from gradcomp.register import register as register
from shmem.lazy import lazy_exports

_LAZY = {
    "get_compressor": "gradcomp.methods",
    "METHODS": "gradcomp.methods",
    "Compressor": "gradcomp.compressors",
    "Communicator": "gradcomp.communicators",
    "Memory": "gradcomp.memory",
    "GradcompState": "gradcomp.hooks",
    "gradcomp_hook": "gradcomp.hooks",
    "NoMemory": "gradcomp.memory",
    "ResidualMemory": "gradcomp.memory",
    "PowerSGDReducer": "gradcomp.powersgd",
    "PartitionedOptimizer": "gradcomp.pto",
    "Planner": "gradcomp.planner",
    "compressors": "gradcomp.compressors",
    "communicators": "gradcomp.communicators",
    "methods": "gradcomp.methods",
    "collectives": "gradcomp.collectives",
    "planner": "gradcomp.planner",
}

__getattr__, __dir__, __all__ = lazy_exports(
    "gradcomp", globals(), _LAZY, eager=["mstopk", "recall", "register", "topk"]
)

"""coordl on NVIDIA DALI: coordl's fetch side (MinIO, partitioned, coordinated) under DALI's GPU or CPU prep.

    import coordl
    loader = coordl.dali.DALILoader(coordl.ImageFolder("/data/train"), batch_size=256, shuffle=True,
                                    device="gpu", cache_bytes=64 << 30,
                                    transform=coordl.dali.train_pipeline(224))

Needs ``pip install -e .[dali]``; names load lazily, so ``import coordl.dali`` does not import DALI.
"""

from __future__ import annotations

from shmem.lazy import lazy_exports

_LAZY = {
    "DALILoader": "coordl.dali.loader",
    "DALITransform": "coordl.dali.ops",
    "train_pipeline": "coordl.dali.ops",
    "eval_pipeline": "coordl.dali.ops",
}

__getattr__, __dir__, __all__ = lazy_exports("coordl.dali", globals(), _LAZY)

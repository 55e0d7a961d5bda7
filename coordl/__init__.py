"""coordl: a drop-in replacement for ``torch.utils.data.DataLoader`` that removes data stalls.

    import coordl
    train = coordl.ImageFolder("/data/train", transform=coordl.transforms.train_transform(224))
    loader = coordl.DataLoader(train, batch_size=64, shuffle=True, num_workers=2, cache_bytes=8 << 30)

Names are imported lazily so that ``import coordl`` stays cheap (no torch import until needed).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "DataLoader": "coordl.dataloader",
    "WorkerDiedError": "coordl.errors",
    "CorruptItemError": "coordl.errors",
    "ImageFolder": "coordl.datasets",
    "FileListDataset": "coordl.datasets",
    "as_item_source": "coordl.datasets",
    "MinioCache": "coordl.minio",
    "ItemSource": "coordl.source",
    "is_item_source": "coordl.source",
    "transforms": "coordl.transforms",
    "synth": "coordl.synth",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'coordl' has no attribute {name!r}")
    mod = importlib.import_module(module)
    value = mod if module.endswith("." + name) else getattr(mod, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__

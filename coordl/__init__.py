"""coordl: a drop-in replacement for ``torch.utils.data.DataLoader`` that removes data stalls.

    import coordl
    train = coordl.ImageFolder("/data/train", transform=coordl.transforms.train_transform(224))
    loader = coordl.DataLoader(train, batch_size=64, shuffle=True, num_workers=2, cache_bytes=8 << 30)

Names are imported lazily so that ``import coordl`` stays cheap (no torch import until needed).
"""

from __future__ import annotations

from coordl.lazy import lazy_exports

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
    "output_buffers": "coordl.output_buffers",
    "synth": "coordl.synth",
}

__getattr__, __dir__, __all__ = lazy_exports("coordl", globals(), _LAZY, eager=["__version__"])

"""coordl: a drop-in replacement for ``torch.utils.data.DataLoader`` that removes data stalls.

    import coordl
    train = coordl.ImageFolder("/data/train", transform=coordl.transforms.train_transform(224))
    loader = coordl.DataLoader(train, batch_size=64, shuffle=True, num_workers=2, cache_bytes=8 << 30)

Names are imported lazily so that ``import coordl`` stays cheap (no torch import until needed).
"""

from __future__ import annotations

from shmem.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "DataLoader": "coordl.dataloader",
    "RemotePrep": "coordl.remote",
    "RemotePrepError": "coordl.remote",
    "WorkerDiedError": "coordl.errors",
    "CorruptItemError": "coordl.errors",
    "ImageFolder": "coordl.data.datasets",
    "FileListDataset": "coordl.data.datasets",
    "LMDBDataset": "coordl.data.lmdb",
    "TarShards": "coordl.data.tar",
    "ShardSampler": "coordl.data.shard_sampler",
    "as_item_source": "coordl.data.adapt",
    "MinioCache": "coordl.fetch.minio",
    "ItemSource": "coordl.data.source",
    "is_item_source": "coordl.data.source",
    "transforms": "coordl.data.transforms",
    "output_buffers": "coordl.ring.output_buffers",
    "synth": "coordl.data.synth",
    "dali": "coordl.dali",
}

__getattr__, __dir__, __all__ = lazy_exports("coordl", globals(), _LAZY, eager=["__version__"])

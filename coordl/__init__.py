"""coordl: a drop-in replacement for ``torch.utils.data.DataLoader`` that removes data stalls.

    import coordl
    train = coordl.ImageFolder("/data/train", transform=coordl.transforms.train_transform(224))
    loader = coordl.DataLoader(train, batch_size=64, shuffle=True, num_workers=2, cache_bytes=8 << 30)

Names are imported lazily so that ``import coordl`` stays cheap (no torch import until needed).
"""

from __future__ import annotations

from shmem.lazy import lazy_exports

_LAZY = {
    "__version__": "coordl._version",
    "DataLoader": "coordl.dataloader",
    "RemotePrep": "coordl.remote",
    "TuneOptions": "coordl.tune",
    "PartitionedOptions": "coordl.partitioned.options",
    "RemotePrepError": "coordl.remote",
    "WorkerDiedError": "coordl.errors",
    "CorruptItemError": "coordl.errors",
    "ImageFolder": "coordl.datasets.files",
    "FileListDataset": "coordl.datasets.files",
    "LMDBDataset": "coordl.packed.lmdb",
    "TarShards": "coordl.packed.tar",
    "ShardSampler": "coordl.packed.shard_sampler",
    "as_item_source": "coordl.datasets.adapt",
    "MinioCache": "coordl.fetch.minio",
    "ItemSource": "coordl.datasets.source",
    "is_item_source": "coordl.datasets.source",
    "transforms": "coordl.prep.transforms",
    "output_buffers": "coordl.ring.output_buffers",
    "synth": "coordl.datasets.synth",
    "dali": "coordl.dali",
}

__getattr__, __dir__, __all__ = lazy_exports("coordl", globals(), _LAZY)

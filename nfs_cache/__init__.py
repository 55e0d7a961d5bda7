"""nfs_cache: stage a remote dataset (mounted directory, ``nfs://`` export, fsspec URL) onto local disk.

The first read of each file copies it into a local stage directory (atomic, checksummed, recorded in a manifest);
later reads are local. ``StagedSource`` is what ``coordl.ImageFolder(..., stage_dir=...)`` uses; ``stage_all`` is
``coordl stage SRC DST``. This package does not import coordl (coordl depends on it, not the reverse).
"""

from nfs_cache.bulk import stage_all
from nfs_cache.sources import FsspecSource, LocalSource, NfsSource, RemoteFile, Source, open_source
from nfs_cache.stager import StagedSource

__all__ = [
    "StagedSource",
    "stage_all",
    "open_source",
    "Source",
    "LocalSource",
    "NfsSource",
    "FsspecSource",
    "RemoteFile",
]

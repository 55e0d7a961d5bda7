"""A bucket prefix as a dataset root: relative paths in, object bytes out.

:class:`S3Source` is an ``nfs_cache.Source`` (list_files, read, describe), so the same object serves

* streaming: ``coordl.ImageFolder("s3://bucket/train")`` reads each item with one GET, no local copy;
* staging: ``coordl.ImageFolder("s3://bucket/train", stage_dir=DIR)`` and ``coordl stage s3://... DST``
  copy objects to local disk through ``nfs_cache`` (atomic, checksummed, resumable).

Importing this module registers it with ``nfs_cache.open_source`` for ``s3://`` URLs (nfs_cache sits below
coordl and cannot import it).
"""

from __future__ import annotations

import os
from typing import Any

from coordl.objectstore.client import ObjectStore
from coordl.objectstore.listing import DEFAULT_MAX_AGE_S, Listing, cached_listing, listing_digest
from coordl.objectstore.options import SCHEMES
from nfs_cache.sources import RemoteFile, Source, _check_relpath, register_scheme

__all__ = ["S3Source"]


class S3Source(Source):
    """The objects under ``s3://bucket/prefix`` as files relative to the prefix.

    Args:
        url: ``s3://bucket[/prefix]``.
        storage_options: endpoint and credentials (None: environment and AWS config files).
        listing_cache_dir: where the listing is kept between runs (None: ``~/.cache/coordl/listings``;
            ``""``: never on disk).
        listing_max_age_s: a listing older than this is listed again.
        refresh_listing: list again now, even when a fresh listing is on disk.
        store: an :class:`ObjectStore` to use instead of making one (shares its counters).
    """

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        listing_cache_dir: str | os.PathLike | None = None,
        listing_max_age_s: float = DEFAULT_MAX_AGE_S,
        refresh_listing: bool = False,
        store: ObjectStore | None = None,
    ) -> None:
        self.store = store if store is not None else ObjectStore(url, storage_options)
        self.url = self.store.url
        self.listing_cache_dir = listing_cache_dir
        self.listing_max_age_s = listing_max_age_s
        self.refresh_listing = refresh_listing
        self._objects: Listing | None = None

    def objects(self) -> Listing:
        """The listing (done once per instance; from the disk cache when fresh), a read-only list of
        :class:`~coordl.objectstore.client.ObjectInfo` held in flat arrays."""
        if self._objects is None:
            self._objects = cached_listing(
                self.store, cache_dir=self.listing_cache_dir, max_age_s=self.listing_max_age_s,
                refresh=self.refresh_listing,
            )  # fmt: skip
        return self._objects

    def list_files(self) -> list[RemoteFile]:
        prefix = self.store.location.key("")
        out = [
            RemoteFile(o.key[len(prefix) :], o.size, o.mtime_ns)
            for o in self.objects()
            if o.key.startswith(prefix) and not o.key.endswith("/")
        ]
        out.sort(key=lambda f: f.relpath)
        return out

    def digest(self) -> str:
        """Digest of the listing (keys, sizes, ETags), for the dataset's identity."""
        return listing_digest(self.objects())

    def read(self, relpath: str) -> bytes:
        return self.store.get(self.store.location.key(_check_relpath(relpath)))

    def read_range(self, relpath: str, start: int, length: int) -> bytes:
        """``length`` bytes of ``relpath`` from ``start`` (one ranged GET)."""
        return self.store.get_range(self.store.location.key(_check_relpath(relpath)), start, length)

    def describe(self, relpath: str) -> str:
        return self.store.describe(self.store.location.key(relpath))

    def stats(self) -> dict[str, int]:
        return self.store.stats()


def _open(url: str) -> S3Source:
    return S3Source(url)


for _scheme in SCHEMES:
    register_scheme(_scheme, _open)

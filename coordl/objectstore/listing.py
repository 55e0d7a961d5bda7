"""List a bucket prefix once: the listing is kept on local disk and reused while it is fresh.

A prefix of a million objects takes a thousand LIST requests (1,000 keys each) and minutes on a far link:
paid on every start of every job, it would dominate short runs. The parent process lists once; DataLoader
workers get the listing with the dataset (pickled or forked), never re-listing; later runs read it from
``cache_dir`` while it is younger than ``max_age_s``. The dataset's identity (which keys caches on top use)
includes a digest of the listing (keys, sizes, ETags), so a changed object is a new dataset to every cache.

The file is JSON (never pickle), written to a temporary name and renamed, so a reader never sees half of one.
In memory a listing is a :class:`Listing`: flat columns (keys and ETags in :class:`shmem.strings.StringArray`,
sizes and mtimes in int64 arrays) that read as a list of :class:`ObjectInfo`, so a million objects cost no
per-object Python objects in the dataset every loader worker inherits or unpickles.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, SupportsIndex

import numpy as np

from coordl.objectstore.client import ObjectInfo, ObjectStore
from shmem.strings import StringArray

__all__ = ["Listing", "cached_listing", "listing_digest", "default_cache_dir", "DEFAULT_MAX_AGE_S"]

DEFAULT_MAX_AGE_S = 24 * 3600.0
_VERSION = 1


def default_cache_dir() -> str:
    """``$COORDL_CACHE_DIR/listings``, else ``~/.cache/coordl/listings``."""
    base = os.environ.get("COORDL_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "coordl")
    return os.path.join(base, "listings")


class Listing(Sequence[ObjectInfo]):
    """The objects of a listing as flat columns; item ``i`` is built as an :class:`ObjectInfo` when read."""

    def __init__(self, objects: Iterable[ObjectInfo | Sequence[Any]] = ()) -> None:
        keys: list[str] = []
        etags: list[str] = []
        numbers: list[tuple[int, int]] = []
        for o in objects:
            key, size, mtime_ns, etag = (
                (o.key, o.size, o.mtime_ns, o.etag) if isinstance(o, ObjectInfo) else o
            )
            keys.append(str(key))
            etags.append(str(etag))
            numbers.append((int(size), int(mtime_ns)))
        self.keys, self.etags = StringArray(keys), StringArray(etags)
        self.sizes_mtimes = np.array(numbers, dtype=np.int64).reshape(-1, 2)  # size, mtime_ns of each key

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, index: SupportsIndex | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        size, mtime_ns = self.sizes_mtimes[index].tolist()
        return ObjectInfo(self.keys[index], size, mtime_ns, self.etags[index])

    def __iter__(self) -> Iterator[ObjectInfo]:
        rows = iter(self.sizes_mtimes.tolist())
        for key, etag in zip(self.keys, self.etags, strict=True):
            size, mtime_ns = next(rows)
            yield ObjectInfo(key, size, mtime_ns, etag)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are unhashable


def listing_digest(objects: Iterable[ObjectInfo]) -> str:
    """16 hex digits over every (key, size, ETag): equal listings, equal digests."""
    h = hashlib.sha256()
    for o in objects:
        h.update(f"{o.key}\t{o.size}\t{o.etag}\n".encode())
    return h.hexdigest()[:16]


def _cache_path(store: ObjectStore, cache_dir: str) -> str:
    store._boto()  # resolves the endpoint: the same bucket name on two servers is two datasets
    ident = f"{store.endpoint}|{store.location.bucket}|{store.location.prefix}"
    return os.path.join(cache_dir, hashlib.sha256(ident.encode()).hexdigest()[:24] + ".json")


def _load(path: str, max_age_s: float) -> Listing | None:
    try:
        with open(path, encoding="utf-8") as f:
            doc: dict[str, Any] = json.load(f)
    except (OSError, ValueError):
        return None
    if doc.get("version") != _VERSION or time.time() - float(doc.get("listed_at", 0)) > max_age_s:
        return None
    try:
        return Listing(doc["objects"])
    except (KeyError, TypeError, ValueError):  # a damaged file is listed again, not trusted
        return None


def _save(path: str, store: ObjectStore, objects: Listing) -> None:
    doc = {
        "version": _VERSION, "url": store.url, "endpoint": store.endpoint, "listed_at": time.time(),
        "objects": [[o.key, o.size, o.mtime_ns, o.etag] for o in objects],
    }  # fmt: skip
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".listing-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def cached_listing(
    store: ObjectStore,
    *,
    cache_dir: str | os.PathLike | None = None,
    max_age_s: float = DEFAULT_MAX_AGE_S,
    refresh: bool = False,
) -> Listing:
    """The objects under the store's prefix: from ``cache_dir`` when fresh, else listed (and saved there).

    ``cache_dir=False``-like empty string disables the disk cache (always lists). ``refresh=True`` lists
    even when a fresh listing is on disk (after the bucket changed). A disk that cannot be written only
    costs the next run a new listing.
    """
    directory = default_cache_dir() if cache_dir is None else os.fspath(cache_dir)
    path = _cache_path(store, directory) if directory else ""
    if path and not refresh:
        found = _load(path, max_age_s)
        if found is not None:
            return found
    objects = Listing(store.list())
    if path:
        try:
            _save(path, store, objects)
        except OSError:
            pass
    return objects

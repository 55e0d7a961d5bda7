"""Full ``s3://bucket/key`` URLs read through one :class:`ObjectStore` per bucket, for file-list datasets.

A file list may name objects of several buckets; each bucket gets its store (made lazily in each process) and
all of them add to one set of counters, so ``stats()`` is the list's total.
"""

from __future__ import annotations

import threading
from typing import Any

from coordl.objectstore.client import STORE_COUNTERS, ObjectStore
from coordl.objectstore.options import client_settings, parse_s3_url

__all__ = ["UrlReader"]


class UrlReader:
    """``read("s3://bucket/key")`` with the same ``storage_options`` for every bucket."""

    def __init__(self, storage_options: dict[str, Any] | None = None) -> None:
        from shmem.counters import SharedCounters

        client_settings(storage_options)  # unknown options fail here, not in a worker
        self.storage_options = dict(storage_options or {})
        self.counters = SharedCounters(STORE_COUNTERS)
        self._stores: dict[str, ObjectStore] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {"storage_options": self.storage_options, "counters": self.counters}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._stores, self._lock = {}, threading.Lock()

    def _store(self, bucket: str) -> ObjectStore:
        store = self._stores.get(bucket)
        if store is None:
            with self._lock:
                store = self._stores.get(bucket)
                if store is None:
                    store = ObjectStore(f"s3://{bucket}", self.storage_options, counters=self.counters)
                    self._stores[bucket] = store
        return store

    def read(self, url: str) -> bytes:
        where = parse_s3_url(url)
        if not where.prefix:
            raise ValueError(f"{url!r} names a bucket, not an object")
        return self._store(where.bucket).get(where.prefix)

    def stats(self) -> dict[str, int]:
        return {name: int(v) for name, v in self.counters.snapshot().items()}

"""memcache: a key-value cache of preprocessed samples (the deterministic part of prep).

Two engines behind one interface (``get_many(keys)``, ``put_many(items)``, ``stats()``, ``close()``):

- :class:`LocalStore`: embedded, one shared-memory table per node, no server; the default.
- :class:`RedisStore`: one Redis server per node, keys spread across nodes by consistent hashing.

Values are NumPy arrays stored as raw bytes behind a small parsed header (:mod:`memcache.codec`), never
pickled. Use with ``coordl.DataLoader(dataset, ..., sample_cache=memcache.LocalStore(8 << 30))``.

Note: ``memcache`` is also the import name of the old python-memcached client; ``coordl`` checks that
the ``memcache`` it imports is this package.
"""

from __future__ import annotations

from memcache.keys import KeySpace as KeySpace
from memcache.keys import sample_key as sample_key
from memcache.local import LocalStore as LocalStore
from shmem.lazy import lazy_exports

# Marker that coordl.fetch.sample_cache checks, so that python-memcached's module is never mistaken for ours.
IS_COORDL_MEMCACHE = True

# RedisStore is imported on first use: LocalStore users need neither redis-py nor its import time.
__getattr__, __dir__, __all__ = lazy_exports(
    "memcache",
    globals(),
    {"RedisStore": "memcache.redis_store", "TLS": "memcache.tls"},
    eager=["LocalStore", "KeySpace", "sample_key", "IS_COORDL_MEMCACHE"],
)

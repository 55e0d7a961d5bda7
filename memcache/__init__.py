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

import importlib
from typing import Any

from memcache.keys import KeySpace, sample_key
from memcache.local import LocalStore

__all__ = ["LocalStore", "RedisStore", "KeySpace", "sample_key", "IS_COORDL_MEMCACHE"]

# Marker that coordl.sample_cache checks, so that python-memcached's module is never mistaken for ours.
IS_COORDL_MEMCACHE = True


def __getattr__(name: str) -> Any:
    # RedisStore is imported on first use: LocalStore users need neither redis-py nor its import time.
    if name == "RedisStore":
        value = importlib.import_module("memcache.redis_store").RedisStore
        globals()[name] = value
        return value
    raise AttributeError(f"module 'memcache' has no attribute {name!r}")

"""The sample-cache tier of the loader: cached results of the deterministic part of prep.

The loader's batched ``__getitems__`` asks :meth:`SampleCacheTier.get_many` for the batch's indices,
fetches and preps only the misses (deterministic part), hands those arrays to :meth:`put_many`, then
runs the random augmentation on every sample, so augmentation still differs between epochs.

Keys combine the dataset's and the deterministic transform's identities (``memcache.keys``), so a
changed transform never serves stale samples. A store that fails (a Redis node down, a full store, a bad
value) never raises into training: the batch is served by fetch+prep, ``sample_cache_errors`` counts
it, and one warning is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["SampleCacheTier", "COUNTER_NAMES", "import_memcache"]

COUNTER_NAMES = ("sample_cache_hits", "sample_cache_misses", "sample_cache_errors")


def import_memcache() -> Any:
    """Import this project's ``memcache`` package, refusing python-memcached's module of the same name."""
    import memcache

    if not getattr(memcache, "IS_COORDL_MEMCACHE", False) or not hasattr(memcache, "LocalStore"):
        where = getattr(memcache, "__file__", "?")
        raise ImportError(
            f"'import memcache' found {where}, which is not coordl's memcache package (probably the "
            "python-memcached client, which uses the same name): uninstall it or reinstall coordl"
        )
    return memcache


class SampleCacheTier:
    """Adapter between the loader and a memcache store (``LocalStore`` or ``RedisStore``).

    Args:
        store: anything with ``get_many(keys)``, ``put_many(items)`` and ``stats()``.
        source: the dataset; its ``dataset_identity()`` and ``prep_identity()`` name the keys.
        counters: a :class:`shmem.counters.SharedCounters` with :data:`COUNTER_NAMES`.

    Picklable when ``store`` and ``counters`` are (both memcache stores and SharedCounters are).
    """

    def __init__(self, store: Any, source: Any, counters: Any) -> None:
        import_memcache()  # fail early, in the main process, if the wrong memcache is installed
        from memcache.keys import KeySpace

        self.store = store
        self.counters = counters
        self.keyspace = KeySpace(str(source.dataset_identity()), str(source.prep_identity()))
        self._warned = False

    def _store_errors(self) -> int:
        try:
            return int(self.store.stats().get("errors", 0))
        except Exception:
            return 0

    def _failed(self, what: str, error: BaseException) -> None:
        self.counters.add("sample_cache_errors", 1)
        if not self._warned:
            self._warned = True
            log.warning(
                "coordl: sample cache %s failed (%s: %s); serving by fetch+prep and continuing",
                what,
                type(error).__name__,
                error,
            )

    def get_many(self, indices: Iterable[int]) -> dict[int, np.ndarray]:
        """Cached deterministic arrays of ``indices`` (hits only; every other index is a miss)."""
        indices = [int(i) for i in indices]
        if not indices:
            return {}
        keys = self.keyspace.keys(indices)
        errors_before = self._store_errors()
        try:
            found = self.store.get_many(keys)
        except Exception as e:  # a store must never stop training
            self._failed("read", e)
            found = {}
        out = {i: found[k] for i, k in zip(indices, keys, strict=True) if k in found}
        self.counters.add_many(
            {
                "sample_cache_hits": len(out),
                "sample_cache_misses": len(indices) - len(out),
                "sample_cache_errors": max(0, self._store_errors() - errors_before),
            }
        )
        return out

    def put_many(self, arrays: Mapping[int, np.ndarray]) -> None:
        """Offer freshly prepped deterministic arrays to the store (it may refuse when full)."""
        if not arrays:
            return
        items = {self.keyspace.key(i): a for i, a in arrays.items() if isinstance(a, np.ndarray)}
        errors_before = self._store_errors()
        try:
            self.store.put_many(items)
        except Exception as e:
            self._failed("write", e)
            return
        delta = self._store_errors() - errors_before
        if delta > 0:
            self.counters.add("sample_cache_errors", delta)

    def stats(self) -> dict[str, Any]:
        """Store-wide numbers the store knows in this process (items held, bytes used, engine)."""
        out: dict[str, Any] = {"sample_cache_backend": type(self.store).__name__}
        try:
            st = self.store.stats()
        except Exception:
            return out
        for name in ("items", "used_bytes", "capacity_bytes", "nodes", "nodes_down", "nodes_full"):
            if name in st:
                out[f"sample_cache_{name}"] = st[name]
        return out

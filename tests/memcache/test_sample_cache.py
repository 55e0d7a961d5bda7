"""SampleCacheTier: keys from the dataset and transform identities, counters, failures never raise."""

from __future__ import annotations

import logging
import sys
import types

import numpy as np
import pytest

from coordl.fetch.sample_cache import COUNTER_NAMES, SampleCacheTier, import_memcache
from memcache import LocalStore
from shmem.counters import SharedCounters


class _Source:
    def __init__(self, prep_id: str = "resize16") -> None:
        self.prep_id = prep_id

    def dataset_identity(self) -> str:
        return "synthetic-100"

    def prep_identity(self) -> str:
        return self.prep_id


class _BrokenStore:
    def get_many(self, keys):
        raise ConnectionError("node gone")

    def put_many(self, items):
        raise OSError("disk on fire")

    def stats(self):
        return {}


@pytest.fixture
def counters():
    c = SharedCounters(COUNTER_NAMES)
    yield c
    c.close()


def test_hits_misses_and_changed_transform(shm_dir, counters):
    store = LocalStore(8 << 20, name="tier", directory=shm_dir)
    try:
        tier = SampleCacheTier(store, _Source(), counters)
        tier.put_many({i: np.full((4, 4), i, np.uint8) for i in range(5)})
        got = tier.get_many(range(8))
        assert sorted(got) == [0, 1, 2, 3, 4] and got[3][0, 0] == 3
        assert counters.snapshot() == {
            "sample_cache_hits": 5,
            "sample_cache_misses": 3,
            "sample_cache_errors": 0,
        }
        other = SampleCacheTier(store, _Source("resize32"), counters)
        assert other.get_many(range(5)) == {}  # another transform never sees these arrays
        assert tier.stats()["sample_cache_items"] == 5
    finally:
        store.close()


def test_store_failures_are_counted_and_warned_once(counters, caplog):
    tier = SampleCacheTier(_BrokenStore(), _Source(), counters)
    with caplog.at_level(logging.WARNING, logger="coordl.fetch.sample_cache"):
        for _ in range(3):
            assert tier.get_many([1, 2]) == {}
            tier.put_many({1: np.zeros(3)})
    snap = counters.snapshot()
    assert snap["sample_cache_errors"] == 6 and snap["sample_cache_misses"] == 6
    assert len([r for r in caplog.records if "sample cache" in r.getMessage()]) == 1


def test_refuses_python_memcached(monkeypatch):
    impostor = types.ModuleType("memcache")
    impostor.Client = object  # what python-memcached exports
    monkeypatch.setitem(sys.modules, "memcache", impostor)
    with pytest.raises(ImportError, match="python-memcached"):
        import_memcache()

"""A partitioned tier that made its own peer counters frees their shared memory at close.

Found by the soak (benchmarks/soak, docs/reliability.md "Soak"): every rank of a partitioned job left
one ``coordl-ctr-<pid>-...`` segment in /dev/shm after ``loader.close()`` (freed only when a later
loader on the host reclaimed the dead owner's segments).
"""

from __future__ import annotations

import os

from coordl.fetch.minio import MinioCache
from coordl.partitioned.ownership import OwnerMap
from coordl.partitioned.redis_peer import PEER_COUNTERS, RedisPeerClient, key_prefix
from coordl.partitioned.tier import PartitionedTier
from shmem.counters import SharedCounters


def _counter_segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"coordl-ctr-{os.getpid()}-")}


def _tier(**kw) -> tuple[PartitionedTier, SharedCounters, MinioCache]:
    base, cache = SharedCounters(["cache_hits", "cache_misses"]), MinioCache(1 << 16, 10)
    client = RedisPeerClient([None, ("127.0.0.1", 1)], password=None, prefix=key_prefix("close-shm"))
    return (
        PartitionedTier(OwnerMap(10, num_nodes=2, seed=0), 0, client, base, local_cache=cache, **kw),
        base,
        cache,
    )


def test_own_peer_counters_are_freed_at_close() -> None:
    before = _counter_segments()
    tier, base, cache = _tier()
    # the base counters, the tier's own peer counters and its pushes' (coordl.partitioned.fetch.PUSH_COUNTERS)
    assert len(_counter_segments() - before) == 3
    tier.close()
    tier.close()  # twice is harmless
    assert len(_counter_segments() - before) == 1  # the base counters: the caller's, closed below
    base.close()
    cache.close()
    assert _counter_segments() == before


def test_peer_counters_given_by_the_caller_stay_the_callers() -> None:
    peer = SharedCounters(PEER_COUNTERS)
    before = _counter_segments()
    tier, base, cache = _tier(peer_counters=peer)
    tier.close()
    assert peer.snapshot()["remote_hits"] == 0  # still open: the caller closes it
    assert len(_counter_segments() - before) == 1  # the base counters; the tier's pushes' are freed
    for obj in (peer, base, cache):
        obj.close()

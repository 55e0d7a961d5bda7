"""OwnerMap, PartitionedSampler and PartitionedTier (two nodes emulated in one process, a Redis each)."""

from __future__ import annotations

import numpy as np
import pytest

from coordl.fetch.minio import MinioCache
from coordl.partitioned.ownership import NodeTopology, OwnerMap, PartitionedSampler
from coordl.partitioned.redis_peer import PEER_COUNTERS, RedisPeerClient, key_prefix
from coordl.partitioned.rendezvous import advertise_address
from coordl.partitioned.tier import PartitionedTier
from memcache.server import start_redis
from shmem.counters import SharedCounters

# -- owner map ------------------------------------------------------------------------------------


def test_owner_map_is_a_deterministic_disjoint_cover() -> None:
    a = OwnerMap(1000, num_nodes=3, seed=7)
    b = OwnerMap(1000, num_nodes=3, seed=7)
    owned = [a.owned(k) for k in range(3)]
    assert sorted(np.concatenate(owned).tolist()) == list(range(1000))
    assert all(np.array_equal(a.owned(k), b.owned(k)) for k in range(3))
    assert a.counts() == [333, 334, 333] or abs(max(a.counts()) - min(a.counts())) <= 1
    assert not np.array_equal(OwnerMap(1000, num_nodes=3, seed=8).owned(0), owned[0])
    # Ownership is spread over the index space, not contiguous runs of indices.
    assert owned[0].max() - owned[0].min() > 900


def test_owner_map_weights_follow_cache_budgets() -> None:
    m = OwnerMap(1000, [3 << 30, 1 << 30])
    assert m.counts() == [750, 250]
    assert m.owner(int(m.owned(1)[0])) == 1
    with pytest.raises(ValueError):
        OwnerMap(10, [0, 0])


# -- sampler --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n,replicas,drop_last", [(10, 3, False), (10, 3, True), (12, 4, False), (2, 4, False)]
)
def test_sampler_equal_shards_cover_the_dataset(n: int, replicas: int, drop_last: bool) -> None:
    samplers = [PartitionedSampler(n, replicas, r, seed=1, drop_last=drop_last) for r in range(replicas)]
    shards = [list(s) for s in samplers]
    assert len({len(s) for s in shards}) == 1  # equal batch counts on every rank: DDP does not hang
    assert all(len(s) == len(samplers[0]) for s in shards)
    union = set().union(*map(set, shards))
    if drop_last:
        assert len(union) == len(shards[0]) * replicas
    else:
        assert union == set(range(n))


def test_sampler_fresh_shard_every_epoch_and_same_across_ranks() -> None:
    s0, s0b = PartitionedSampler(100, 2, 0, seed=3), PartitionedSampler(100, 2, 0, seed=3)
    e0 = s0.indices().tolist()
    s0.set_epoch(1)
    s0b.set_epoch(1)
    assert s0.indices().tolist() != e0 and list(s0) == list(s0b)
    s0.set_epoch(1)
    s1 = PartitionedSampler(100, 2, 1, seed=3)
    s1.set_epoch(1)
    assert set(s0) | set(s1) == set(range(100)) and not set(s0) & set(s1)


def test_sampler_advances_without_set_epoch_and_obeys_it() -> None:
    s = PartitionedSampler(50, 1, 0, seed=4)
    a, b = list(s), list(s)
    assert a != b and s.epoch == 1
    s.set_epoch(0)
    assert list(s) == a


def test_topology_from_torchrun_env() -> None:
    t = NodeTopology.from_env(
        {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1"}
    )
    assert (t.node, t.num_nodes, t.is_node_leader) == (1, 2, False)
    assert NodeTopology.from_env({}).num_nodes == 1
    spawned = NodeTopology.from_env({"RANK": "1", "WORLD_SIZE": "2"})  # mp.spawn: one node, rank 0 leads
    assert (spawned.num_nodes, spawned.node, spawned.is_node_leader) == (1, 0, False)
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE"):
        NodeTopology.from_env({"RANK": "0", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"})


def test_advertise_address_prefers_explicit_then_route() -> None:
    assert advertise_address({"COORDL_PEER_ADDR": "10.1.2.3"}) == "10.1.2.3"
    assert advertise_address({"MASTER_ADDR": "127.0.0.1"}) == "127.0.0.1"
    assert advertise_address({"GLOO_SOCKET_IFNAME": "lo"}) == "127.0.0.1"
    with pytest.raises(OSError, match="nosuchif0"):
        advertise_address({"GLOO_SOCKET_IFNAME": "nosuchif0"})


# -- the tier: two nodes in one process -----------------------------------------------------------

N_ITEMS = 60
PASSWORD = "partition-test-secret-0123456789"
PREFIX = key_prefix("test-partition")


def _item(i: int) -> bytes:
    return bytes([i % 251]) * (100 + i)


class TwoNodes:
    """Two node leaders, each with a MinIO cache sized for its share (plus slack) and a Redis."""

    def __init__(self, push: bool = True) -> None:
        self.owners = OwnerMap(N_ITEMS, num_nodes=2, seed=11)
        self.caches = [MinioCache(200 * N_ITEMS, N_ITEMS) for _ in range(2)]
        self.servers = [start_redis(16 << 20, password=PASSWORD) for _ in range(2)]
        addrs = [(s.host, s.port) for s in self.servers]
        self.base = [SharedCounters(["cache_hits", "cache_misses"]) for _ in range(2)]
        self.peer = [SharedCounters(PEER_COUNTERS) for _ in range(2)]
        self.tiers = [
            PartitionedTier(
                self.owners,
                k,
                RedisPeerClient(addrs, password=PASSWORD, prefix=PREFIX, timeout_s=2, backoff_s=60),
                self.base[k],
                local_cache=self.caches[k],
                push=push,
                peer_counters=self.peer[k],
                mirror_local=True,
            )
            for k in range(2)
        ]
        self.storage_reads = 0

    def fetch(self, node: int, index: int) -> bytes:
        """What coordl.fetch.tiers.TierLookup.fetch (a LoaderSource's fetch) does with one tier."""
        tier = self.tiers[node]
        raw = tier.get(index)
        if raw is None:
            raw = _item(index)
            self.storage_reads += 1
            tier.offer(index, raw)
        return bytes(raw)

    def epoch(self, epoch: int) -> int:
        before = self.storage_reads
        for node in range(2):
            s = PartitionedSampler(N_ITEMS, 2, node, seed=5)
            s.set_epoch(epoch)
            for i in s:
                assert self.fetch(node, i) == _item(i)
        for t in self.tiers:
            t.flush()
        return self.storage_reads - before

    def close(self) -> None:
        for t in self.tiers:
            t.close()
        for s in self.servers:
            s.stop()
        for c in self.caches:
            c.close()


@pytest.fixture
def two_nodes():
    nodes = TwoNodes()
    yield nodes
    nodes.close()


def test_storage_is_read_only_in_the_first_epoch(two_nodes: TwoNodes) -> None:
    assert two_nodes.epoch(0) == N_ITEMS
    assert two_nodes.epoch(1) == 0
    assert two_nodes.epoch(2) == 0
    # Each node's Redis holds exactly the items it owns; its MinIO cache only owned items it read itself.
    import redis

    for k, (cache, server) in enumerate(zip(two_nodes.caches, two_nodes.servers, strict=True)):
        r = redis.Redis(host=server.host, port=server.port, password=PASSWORD)
        held = {int(key[len(PREFIX) :]) for key in r.scan_iter(match=f"{PREFIX}*")}
        assert held == set(two_nodes.owners.owned(k).tolist())
        assert {i for i in range(N_ITEMS) if i in cache} <= held
    st = [t.stats() for t in two_nodes.tiers]
    remote_hits = sum(s["remote_hits"] for s in st)
    local_hits = sum(c.snapshot()["cache_hits"] for c in two_nodes.base)
    assert remote_hits + local_hits == 2 * N_ITEMS
    assert remote_hits > 0 and sum(s["remote_bytes"] for s in st) > 0
    assert sum(s["remote_pushes"] for s in st) > 0
    assert st[0]["partition_nodes"] == 2


def test_without_push_owners_fill_only_from_their_own_reads() -> None:
    nodes = TwoNodes(push=False)
    try:
        first = nodes.epoch(0)
        assert first == N_ITEMS
        assert 0 < nodes.epoch(1) < N_ITEMS  # what other nodes read in epoch 0 is still missing
    finally:
        nodes.close()


def test_dead_peer_falls_back_to_storage(two_nodes: TwoNodes) -> None:
    two_nodes.epoch(0)
    two_nodes.servers[1].stop()  # node 1 dies
    reads = 0
    for i in range(N_ITEMS):
        before = two_nodes.storage_reads
        assert two_nodes.fetch(0, i) == _item(i)
        reads += two_nodes.storage_reads - before
    assert reads == len(two_nodes.owners.owned(1))  # exactly node 1's items came from storage
    st = two_nodes.tiers[0].stats()
    assert st["remote_errors"] == 1  # one failure, then the peer is skipped while down
    assert st["remote_skipped_down"] == reads - 1


def test_get_many_asks_each_owner_once_per_batch(two_nodes: TwoNodes) -> None:
    two_nodes.epoch(0)  # fills both caches
    tier = two_nodes.tiers[0]
    before = tier.stats()["remote_requests"]
    batch = list(range(N_ITEMS))
    got = tier.get_many(batch)
    assert {i: bytes(v) for i, v in got.items()} == {i: _item(i) for i in batch}
    # One MGET to node 1 for all its items, one to this node's own Redis for the owned items its MinIO
    # cache lacks (those node 1 read and pushed): at most one request per owner.
    assert 1 <= tier.stats()["remote_requests"] - before <= 2


def test_get_many_reports_misses_by_absence() -> None:
    nodes = TwoNodes()
    try:
        got = nodes.tiers[0].get_many(range(N_ITEMS))
        assert got == {}
        assert nodes.base[0].snapshot()["cache_misses"] == N_ITEMS
    finally:
        nodes.close()


# -- coordl.DataLoader(partitioned=True) in a single process (one node, no torch.distributed) ---------


class Items:
    """A fetch/prep item source over synthetic bytes."""

    def __len__(self) -> int:
        return N_ITEMS

    def fetch(self, i: int) -> bytes:
        return _item(i)

    def prep(self, raw: bytes, i: int) -> int:
        assert raw == _item(i)
        return i


def test_loader_partitioned_single_node_caches_and_shards(monkeypatch) -> None:
    import coordl

    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        monkeypatch.delenv(k, raising=False)
    with coordl.DataLoader(
        Items(), batch_size=8, shuffle=True, cache_bytes=1 << 20, partitioned=True
    ) as loader:
        assert isinstance(loader.sampler, PartitionedSampler)
        first = [int(x) for b in loader for x in b]
        second = [int(x) for b in loader for x in b]
        assert sorted(first) == sorted(second) == list(range(N_ITEMS))
        assert first != second  # the epoch advances without set_epoch
        ep = loader.epoch_stats()
        assert ep[0]["storage_items_read"] == N_ITEMS and ep[1]["storage_items_read"] == 0
        st = loader.stats()
        assert st["remote_hits"] == 0 and st["remote_errors"] == 0 and st["partition_nodes"] == 1


def test_loader_partitioned_needs_cache_bytes() -> None:
    import coordl

    with pytest.raises(ValueError, match="cache_bytes"):
        coordl.DataLoader(Items(), batch_size=8, partitioned=True)


def test_tier_pickles_for_spawned_workers(two_nodes: TwoNodes) -> None:
    import pickle

    two_nodes.epoch(0)
    clone = pickle.loads(pickle.dumps(two_nodes.tiers[0]))
    assert clone.server is None
    remote = int(two_nodes.owners.owned(1)[0])
    local = int(two_nodes.owners.owned(0)[0])
    assert bytes(clone.get(remote)) == _item(remote)  # over its own fresh connection
    assert bytes(clone.get(local)) == _item(local)  # through the attached shared-memory cache
    clone.client.close()


def test_owned_items_a_peer_pushed_are_kept_in_shared_memory_once_read(two_nodes: TwoNodes) -> None:
    two_nodes.epoch(0)
    owned = two_nodes.owners.owned(0).tolist()
    cache = two_nodes.caches[0]
    assert any(i not in cache for i in owned)  # node 1 read some of them and pushed them to node 0's Redis
    got = two_nodes.tiers[0].get_many(owned)
    assert {i: bytes(v) for i, v in got.items()} == {i: _item(i) for i in owned}
    assert all(i in cache for i in owned)  # the next read of any of them is from the MinIO cache
    before = two_nodes.tiers[0].stats()["remote_requests"]
    two_nodes.tiers[0].get_many(owned)
    assert two_nodes.tiers[0].stats()["remote_requests"] == before

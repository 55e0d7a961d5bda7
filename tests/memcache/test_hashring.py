"""Consistent hashing: balance and minimal movement when a node is added."""

from __future__ import annotations

from memcache.hashring import HashRing


def test_keys_spread_about_evenly():
    ring = HashRing(["a:1", "b:1", "c:1"])
    keys = [f"mc1:abc:{i}" for i in range(30000)]
    counts = {n: len(ks) for n, ks in ring.split(keys).items()}
    assert set(counts) == {"a:1", "b:1", "c:1"}
    assert max(counts.values()) < 1.25 * min(counts.values())


def test_adding_a_node_moves_about_one_share():
    keys = [f"k{i}" for i in range(20000)]
    before = HashRing(["a", "b", "c"])
    after = HashRing(["a", "b", "c", "d"])
    moved = sum(before.node_for(k) != after.node_for(k) for k in keys)
    assert 0.15 < moved / len(keys) < 0.35  # about 1/4, and only to the new node
    assert all(after.node_for(k) == "d" for k in keys if before.node_for(k) != after.node_for(k))


def test_order_of_nodes_does_not_matter():
    keys = [f"k{i}" for i in range(1000)]
    r1, r2 = HashRing(["a", "b", "c"]), HashRing(["c", "a", "b"])
    assert all(r1.node_for(k) == r2.node_for(k) for k in keys)

"""A value the sample cache refused (corrupt, or another key's) is replaced by the next put, not kept forever.

Found by the soak (benchmarks/soak, docs/reliability.md "Soak"): after wrong values were stored under six
keys, every later epoch counted the same six errors and re-prepped the same six items, because the
put that followed each miss was a ``SET NX`` and the wrong value was never overwritten.
"""

from __future__ import annotations

import numpy as np
import pytest
import redis

from memcache import RedisStore
from memcache.codec import encode

pytestmark = pytest.mark.redis


@pytest.mark.parametrize("wrong", ["another_key", "flipped_payload", "junk"])
def test_refused_value_is_overwritten_by_the_next_put(redis_nodes, wrong: str) -> None:
    node = redis_nodes[0]
    store = RedisStore([node.address])
    right = np.arange(40, dtype=np.uint8)
    good = encode("k1", right)
    bad = {
        "another_key": encode("k2", right),
        "flipped_payload": good[:-1] + bytes([good[-1] ^ 0x5A]),
        "junk": b"\x00" * len(good),
    }[wrong]
    host, port = node.address.rsplit(":", 1)
    raw = redis.Redis(host=host, port=int(port), password=store.password)
    raw.set("k1", bad)

    assert store.get_many(["k1"]) == {}  # refused: a miss and an error
    assert store.stats()["errors"] == 1
    assert store.put_many({"k1": right}) == 1  # overwrites the refused value
    got = store.get_many(["k1"])
    assert list(got) == ["k1"] and np.array_equal(got["k1"], right)
    assert raw.get("k1") == good
    # A key that was not refused keeps SET NX: a present value is never overwritten.
    raw.set("k3", encode("k3", right))
    assert store.put_many({"k3": np.zeros(40, dtype=np.uint8)}) == 0
    assert np.array_equal(store.get_many(["k3"])["k3"], right)

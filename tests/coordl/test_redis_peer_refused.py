"""A value the partitioned cache refused (another key's, another length, not a frame) is replaced by the
next push of that item, not kept by ``SET NX`` forever.

Found by the soak (benchmarks/soak, docs/reliability.md "Soak"): wrong values stored under a node's keys
made every later epoch read those items from storage again and count the same errors.
"""

from __future__ import annotations

import pytest
import redis

from coordl.partitioned.redis_peer import RedisPeerClient, encode_item, key_prefix
from memcache.server import start_redis

pytestmark = pytest.mark.redis

PASSWORD = "q" * 32
PREFIX = key_prefix("test-redis-peer-refused")


@pytest.mark.parametrize("wrong", ["another_key", "another_length", "junk"])
def test_refused_value_is_overwritten_by_the_next_push(wrong: str) -> None:
    server = start_redis(16 << 20, password=PASSWORD)
    try:
        client = RedisPeerClient([(server.host, server.port)], password=PASSWORD, prefix=PREFIX,
                                 item_size=lambda i: 4)  # fmt: skip
        raw = redis.Redis(host=server.host, port=server.port, password=PASSWORD)
        bad = {
            "another_key": encode_item(f"{PREFIX}9", b"good"),
            "another_length": encode_item(f"{PREFIX}1", b"toolong"),
            "junk": b"\x00" * 40,
        }[wrong]
        raw.set(f"{PREFIX}1", bad)
        assert client.fetch({0: [1]}) == {}  # refused: read from storage
        assert client.put(0, 1, b"good")  # the push after that storage read replaces it
        assert bytes(client.fetch({0: [1]})[1]) == b"good"
        # An item not refused keeps SET NX: a present value is never overwritten.
        raw.set(f"{PREFIX}2", encode_item(f"{PREFIX}2", b"kept"))
        assert not client.put(0, 2, b"othr")
        assert bytes(client.fetch({0: [2]})[2]) == b"kept"
        client.close()
    finally:
        server.stop()

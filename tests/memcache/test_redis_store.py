"""RedisStore against real redis-server processes: spreading, password, dead nodes, full nodes, bad values."""

from __future__ import annotations

import logging
import multiprocessing as mp
import pickle

import numpy as np
import pytest
import redis

from memcache import KeySpace, RedisStore
from memcache.codec import encode
from memcache.server import start_redis

pytestmark = pytest.mark.redis


def _arrays(n: int, size: int = 16) -> dict[str, np.ndarray]:
    ks = KeySpace("synthetic", "resize16")
    return {ks.key(i): np.full((size, size, 3), i % 251, np.uint8) for i in range(n)}


def _child_get(store: RedisStore, keys: list[str], q) -> None:
    q.put(len(store.get_many(keys)))


def test_round_trip_spreads_keys_over_nodes(redis_nodes):
    store = RedisStore([s.address for s in redis_nodes])
    items = _arrays(300)
    assert store.put_many(items) == 300
    got = store.get_many(list(items) + ["mc1:none:1"])
    assert len(got) == 300 and all(np.array_equal(got[k], v) for k, v in items.items())
    sizes = [redis.Redis(host=s.host, port=s.port).dbsize() for s in redis_nodes]
    assert sum(sizes) == 300 and min(sizes) > 50  # each node holds about a third
    st = store.stats()
    assert (st["hits"], st["misses"], st["errors"]) == (300, 1, 0)
    assert store.put_many(items) == 0  # SET NX: never overwritten
    store.close()


def test_worker_process_uses_its_own_connection(redis_nodes):
    store = RedisStore([s.address for s in redis_nodes])
    items = _arrays(20)
    store.put_many(items)
    clone = pickle.loads(pickle.dumps(store))
    assert "_clients" not in clone.__dict__
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_get, args=(store, list(items), q))
    p.start()
    assert q.get(timeout=60) == 20
    p.join(60)
    assert store.get_many(list(items)).keys() == items.keys()  # parent's socket still fine
    store.close()


def test_password(tmp_path):
    server = start_redis(16 << 20, password="s3cret-pw")
    try:
        items = _arrays(5)
        good = RedisStore([server.address], password="s3cret-pw")
        assert good.put_many(items) == 5 and len(good.get_many(list(items))) == 5
        for wrong in (None, "nope"):
            bad = RedisStore([server.address], password=wrong)
            assert bad.get_many(list(items)) == {}  # a miss, not an exception
            assert bad.stats()["errors"] >= 1
            assert bad.put_many(items) == 0
    finally:
        server.stop()


def test_killed_node_becomes_misses_and_warns_once(redis_nodes, caplog):
    store = RedisStore([s.address for s in redis_nodes], retry_after_s=60)
    items = _arrays(300)
    store.put_many(items)
    victim = redis_nodes[1]
    on_victim = store._ring.split(list(items)).get(victim.address, [])
    victim.kill()  # mid-epoch
    with caplog.at_level(logging.WARNING, logger="memcache.redis_store"):
        for _ in range(3):
            got = store.get_many(list(items))
            assert len(got) == 300 - len(on_victim)
        assert store.put_many(_arrays(10)) >= 0  # puts to the dead node are dropped, not raised
    warnings = [r for r in caplog.records if victim.address in r.getMessage()]
    assert len(warnings) == 1
    st = store.stats()
    assert st["node_failures"] == 1 and st["nodes_down"] == 1 and st["errors"] >= 1


def test_stale_or_foreign_value_is_a_counted_miss(redis_nodes):
    node = redis_nodes[0]
    store = RedisStore([node.address])
    raw = redis.Redis(host=node.host, port=node.port)
    ks = KeySpace("synthetic", "resize16")
    raw.set(ks.key(1), encode(ks.key(2), np.ones((4, 4), np.uint8)))  # value of another key
    raw.set(ks.key(3), b"\x80\x04\x95 a pickle, or anything else")  # not our format at all
    raw.set(ks.key(4), encode(ks.key(4), np.ones((4, 4), np.uint8))[:-3])  # truncated
    assert store.get_many([ks.key(i) for i in (1, 3, 4)]) == {}
    st = store.stats()
    assert st["errors"] == 3 and st["misses"] == 3 and st["hits"] == 0


def test_full_node_stops_puts_without_crashing():
    server = start_redis(3 << 20)  # noeviction: Redis refuses writes beyond this
    try:
        store = RedisStore([server.address])
        big = {f"mc1:x:{i}": np.zeros(64 << 10, np.uint8) for i in range(200)}
        stored = store.put_many(big)
        st = store.stats()
        assert 0 < stored < 200 and st["nodes_full"] == 1 and st["put_rejected"] == 200 - stored
        assert store.put_many({"mc1:x:late": np.zeros(10, np.uint8)}) == 0
        assert len(store.get_many(list(big))) == stored  # what it holds is still served
    finally:
        server.stop()


def test_bad_node_address_is_rejected():
    with pytest.raises(ValueError, match="host:port"):
        RedisStore(["localhost"])


@pytest.mark.redis
def test_a_server_started_to_die_with_its_parent_dies_even_when_the_parent_is_killed():
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    child = subprocess.Popen(
        [sys.executable, "-c", "import time; from memcache.server import start_redis; "
         "s = start_redis(16 << 20, die_with_parent=True); print(s.pid, flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ},
    )  # fmt: skip
    pid = int(child.stdout.readline())
    assert psutil.pid_exists(pid)
    child.send_signal(signal.SIGKILL)  # no cleanup runs in the parent
    child.wait(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail("redis-server outlived the process that started it")

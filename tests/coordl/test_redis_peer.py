"""RedisPeerClient against real redis-servers: batched round trips, checked values, faults, fork.

Faults, as the partitioned cache promises them: a node's Redis killed or frozen costs one wait and one
warning, then its items come from storage; a wrong password is one clear error; a full node answers
"not cached", never evicts; a half-written value is never served.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import time

import pytest

from coordl.partitioned.redis_peer import PEER_COUNTERS, RedisPeerClient, encode_item, key_prefix
from memcache.server import start_redis
from shmem.counters import SharedCounters

pytestmark = pytest.mark.redis

PASSWORD = "p" * 32
PREFIX = key_prefix("test-redis-peer")


@pytest.fixture
def counters():
    c = SharedCounters(PEER_COUNTERS)
    yield c
    c.close()


@pytest.fixture
def server():
    s = start_redis(64 << 20, password=PASSWORD)
    yield s
    s.stop()


def client_of(*servers, **kw) -> RedisPeerClient:
    kw.setdefault("password", PASSWORD)
    return RedisPeerClient([(s.host, s.port) for s in servers], prefix=PREFIX, **kw)


def _redis(s):
    import redis

    return redis.Redis(host=s.host, port=s.port, password=PASSWORD)


def test_get_hit_miss_and_large_item(server, counters) -> None:
    client = client_of(server, counters=counters)
    big = os.urandom(3 << 20)
    assert client.put(0, 3, b"abc") and client.put(0, 4, big)
    assert bytes(client.get(0, 3)) == b"abc"
    assert bytes(client.get(0, 4)) == big
    assert client.get(0, 5) is None
    assert not client.put(0, 3, b"xyz")  # SET NX: never overwrites
    assert bytes(client.get(0, 3)) == b"abc"
    assert client.ping(0)
    client.close()
    snap = counters.snapshot()
    assert snap["remote_hits"] == 3 and snap["remote_misses"] == 1
    assert snap["remote_bytes"] == 3 + (3 << 20) + 3 and snap["remote_errors"] == 0


def test_a_batch_is_one_mget_per_node_all_sent_first(counters) -> None:
    s0, s1 = start_redis(64 << 20, password=PASSWORD), start_redis(64 << 20, password=PASSWORD)
    try:
        client = client_of(s0, s1, counters=counters)
        for i in range(100):
            client.put(i % 2, i, bytes([i]) * (i + 1))
        for s in (s0, s1):
            _redis(s).config_resetstat()
        got = client.fetch({0: list(range(0, 100, 2)) + [1], 1: list(range(1, 100, 2))})
        assert sorted(got) == list(range(100))  # 1 is a miss on node 0, a hit on node 1
        assert all(bytes(got[i]) == bytes([i]) * (i + 1) for i in got)
        assert counters.snapshot()["remote_requests"] == 2
        for s in (s0, s1):  # one MGET each, nothing else
            stats = _redis(s).info("commandstats")
            assert stats["cmdstat_mget"]["calls"] == 1 and "cmdstat_get" not in stats
    finally:
        s0.stop()
        s1.stop()


def test_foreign_values_are_refused_never_served(server, counters) -> None:
    client = client_of(server, counters=counters, item_size=lambda i: 4)
    r = _redis(server)
    r.set(f"{PREFIX}1", pickle.dumps(b"evil"))  # not a frame: never unpickled, refused
    r.set(f"{PREFIX}2", encode_item(f"{PREFIX}9", b"good"))  # a frame written under another key
    r.set(f"{PREFIX}3", encode_item(f"{PREFIX}3", b"toolong"))  # not the dataset's length
    r.set(f"{PREFIX}4", encode_item(f"{PREFIX}4", b"good")[:-2])  # truncated
    r.set(f"{PREFIX}5", encode_item(f"{PREFIX}5", b"good"))
    assert client.fetch({0: [1, 2, 3, 4, 5]}).keys() == {5}
    snap = counters.snapshot()
    assert snap["remote_errors"] == 4 and snap["remote_misses"] == 4 and snap["remote_hits"] == 1
    assert not client.is_down(0)  # a bad value is a miss, not a node failure


def test_a_half_written_value_is_never_stored(server) -> None:
    """A writer that dies in the middle of its SET leaves nothing: Redis runs a command only whole."""
    key = f"{PREFIX}7"
    value = encode_item(key, os.urandom(100_000))
    cmd = b"*4\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (len(key), key.encode(), len(value))
    with socket.create_connection((server.host, server.port), timeout=5) as s:
        s.sendall(b"AUTH %s\r\n" % PASSWORD.encode())
        assert s.recv(5) == b"+OK\r\n"
        s.sendall(cmd + value[: len(value) // 2])  # then the writer dies
    time.sleep(0.2)
    assert _redis(server).exists(key) == 0
    assert client_of(server).get(0, 7) is None


def test_a_full_node_answers_not_cached_and_evicts_nothing(counters, caplog) -> None:
    s = start_redis(4 << 20, password=PASSWORD)  # a few 100 KiB items above Redis's own ~1 MiB
    try:
        client = client_of(s, counters=counters)
        items = {i: os.urandom(100_000) for i in range(60)}
        with caplog.at_level(logging.INFO, logger="coordl"):
            stored = [i for i in items if client.put(0, i, items[i])]
        assert 0 < len(stored) < len(items) and "full" in caplog.text
        assert not client.put(0, 59, items[59])  # nothing more is sent to a full node
        got = client.fetch({0: list(items)})
        assert sorted(got) == stored  # every stored item still there (noeviction), the rest misses
        assert all(bytes(got[i]) == items[i] for i in got)  # and never a wrong or partial one
        assert not client.is_down(0)
    finally:
        s.stop()


def test_killed_node_is_skipped_and_warned_once(server, counters, caplog) -> None:
    client = client_of(server, counters=counters, backoff_s=60)
    client.put(0, 1, b"x")
    assert bytes(client.get(0, 1)) == b"x"  # leaves an open connection
    server.kill()
    with caplog.at_level(logging.WARNING, logger="coordl"):
        assert client.get(0, 1) is None
        assert client.get(0, 1) is None
        assert not client.put(0, 2, b"y")
    assert client.is_down(0)
    assert caplog.text.count("failed") == 1
    snap = counters.snapshot()
    assert snap["remote_errors"] == 1 and snap["remote_skipped_down"] == 1


def test_frozen_node_costs_one_timeout_then_is_retried_after_backoff(server, counters, caplog) -> None:
    client = client_of(server, counters=counters, timeout_s=0.5, backoff_s=1.0)
    client.put(0, 1, b"back")
    os.kill(server.pid, signal.SIGSTOP)  # alive, holds its connections, answers nothing
    try:
        with caplog.at_level(logging.WARNING, logger="coordl"):
            t0 = time.monotonic()
            assert client.get(0, 1) is None
            assert 0.4 < time.monotonic() - t0 < 5
            t0 = time.monotonic()
            assert client.get(0, 1) is None  # down: not asked again
            assert time.monotonic() - t0 < 0.1
        assert caplog.text.count("failed") == 1 and counters.snapshot()["remote_errors"] == 1
    finally:
        os.kill(server.pid, signal.SIGCONT)
    time.sleep(1.1)
    assert bytes(client.get(0, 1)) == b"back"  # after the backoff, on a fresh connection


def test_wrong_password_is_one_clear_error(server, counters, caplog) -> None:
    _redis(server).set(f"{PREFIX}0", encode_item(f"{PREFIX}0", b"secret data"))
    intruder = client_of(server, counters=counters, password="w" * 32, backoff_s=60)
    with caplog.at_level(logging.WARNING, logger="coordl"):
        assert intruder.get(0, 0) is None and intruder.is_down(0)
        assert not intruder.put(0, 1, b"poison")
        assert intruder.get(0, 0) is None
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and errors[0].levelno == logging.ERROR
    assert "refused the password" in errors[0].getMessage()
    assert _redis(server).exists(f"{PREFIX}1") == 0
    assert bytes(client_of(server).get(0, 0)) == b"secret data"


def test_forked_child_opens_its_own_connections(server, counters) -> None:
    client = client_of(server, counters=counters)
    client.put(0, 2, b"child")
    assert bytes(client.get(0, 2)) == b"child"
    parent_conn = client._conns()[0]
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        ok = bytes(client.get(0, 2)) == b"child" and client._conns()[0] is not parent_conn
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert bytes(client.get(0, 2)) == b"child"  # the parent's connection is intact
    assert client._conns()[0] is parent_conn
    assert counters.snapshot()["remote_hits"] == 3


def test_client_pickles_without_its_connections(server) -> None:
    client = client_of(server)
    client.put(0, 3, b"copy")
    clone = pickle.loads(pickle.dumps(client))
    assert bytes(clone.get(0, 3)) == b"copy" and clone._conns()[0] is not client._conns()[0]


def test_replies_are_parsed_by_hiredis(server) -> None:
    from redis._parsers.hiredis import _HiredisParser

    client = client_of(server)
    client.put(0, 1, b"h")
    assert bytes(client.get(0, 1)) == b"h"
    assert isinstance(client._conns()[0]._parser, _HiredisParser)  # hiredis is a dependency

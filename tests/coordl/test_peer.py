"""PeerServer / PeerClient: raw bytes round-trip, misses, PUT admission, dead peers, timeouts, fork."""

from __future__ import annotations

import logging
import os
import socket
import struct
import time

import pytest

from coordl.counters import SharedCounters
from coordl.peer import _REQ, _RESP, MAGIC, OP_GET, PEER_COUNTERS, ST_ERR, PeerClient, PeerServer


class DictCache:
    """A stand-in for MinioCache: the server only needs get/put/num_items."""

    def __init__(self, num_items: int) -> None:
        self.num_items = num_items
        self.items: dict[int, bytes] = {}

    def get(self, index: int) -> memoryview | None:
        raw = self.items.get(index)
        return None if raw is None else memoryview(raw)

    def put(self, index: int, raw: bytes) -> bool:
        self.items.setdefault(index, bytes(raw))
        return True


@pytest.fixture
def counters():
    c = SharedCounters(PEER_COUNTERS)
    yield c
    c.close()


def test_get_hit_miss_and_large_item(counters) -> None:
    cache = DictCache(10)
    cache.items[3] = b"abc"
    cache.items[4] = os.urandom(3 << 20)
    with PeerServer(cache, host="127.0.0.1") as server:
        client = PeerClient([server.address], counters=counters)
        assert client.get(0, 3) == b"abc"
        assert client.get(0, 4) == cache.items[4]
        assert client.get(0, 5) is None
        assert client.ping(0)
        client.close()
    snap = counters.snapshot()
    assert snap["remote_hits"] == 2 and snap["remote_misses"] == 1
    assert snap["remote_bytes"] == 3 + (3 << 20)
    assert snap["remote_errors"] == 0


def test_put_only_admits_accepted_indices(counters) -> None:
    cache = DictCache(10)
    with PeerServer(cache, host="127.0.0.1", accepts=lambda i: i % 2 == 0) as server:
        client = PeerClient([server.address], counters=counters)
        assert client.put(0, 2, b"even")
        assert client.put(0, 3, b"odd")  # answered, not stored
        assert client.get(0, 2) == b"even"
        assert client.get(0, 3) is None
    assert counters.snapshot()["remote_pushes"] == 2


def test_out_of_range_index_is_an_error_not_a_crash(counters, caplog) -> None:
    with PeerServer(DictCache(4), host="127.0.0.1") as server:
        client = PeerClient([server.address], counters=counters)
        with caplog.at_level(logging.WARNING, logger="coordl"):
            assert client.get(0, 99) is None
        assert "outside this cache" in caplog.text
        assert client.get(0, 1) is None  # the connection and the peer are still usable
        assert not client.is_down(0)
    assert counters.snapshot()["remote_errors"] == 1


def test_dead_peer_is_marked_down_and_warned_once(counters, caplog) -> None:
    cache = DictCache(4)
    cache.items[1] = b"x"
    server = PeerServer(cache, host="127.0.0.1")
    client = PeerClient([server.address], counters=counters, backoff_s=60)
    assert client.get(0, 1) == b"x"  # leaves a pooled connection
    server.stop()
    with caplog.at_level(logging.WARNING, logger="coordl"):
        assert client.get(0, 1) is None
        assert client.get(0, 1) is None
    assert client.is_down(0)
    assert caplog.text.count("failed") == 1
    snap = counters.snapshot()
    assert snap["remote_errors"] == 1 and snap["remote_skipped_down"] == 1


def test_down_peer_is_retried_after_backoff(counters) -> None:
    cache = DictCache(4)
    cache.items[0] = b"back"
    server = PeerServer(cache, host="127.0.0.1")
    port = server.address[1]
    server.stop()
    client = PeerClient([("127.0.0.1", port)], counters=counters, backoff_s=0.2)
    assert client.get(0, 0) is None and client.is_down(0)
    try:
        server = PeerServer(cache, host="127.0.0.1", port=port)
    except OSError:
        pytest.skip("the freed port was taken by another process")
    with server:
        time.sleep(0.3)
        assert client.get(0, 0) == b"back"


def test_silent_peer_times_out(counters) -> None:
    # A listener that never answers: a peer cut off from the network, not dead.
    silent = socket.create_server(("127.0.0.1", 0))
    try:
        client = PeerClient([silent.getsockname()[:2]], counters=counters, timeout_s=0.3, backoff_s=60)
        t0 = time.monotonic()
        assert client.get(0, 1) is None
        assert time.monotonic() - t0 < 5
        assert client.is_down(0)
    finally:
        silent.close()
    assert counters.snapshot()["remote_errors"] == 1


def test_server_drops_garbage_and_rejects_huge_put(counters) -> None:
    with PeerServer(DictCache(4), host="127.0.0.1", max_item_bytes=100) as server:
        with socket.create_connection(server.address, timeout=5) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                assert s.recv(100) == b""  # closed without an answer
            except ConnectionResetError:
                pass  # closed with our unread bytes pending: also no answer
        with socket.create_connection(server.address, timeout=5) as s:
            s.sendall(_REQ.pack(MAGIC, 2, 0, 1 << 40))
            magic, status, n = _RESP.unpack(s.recv(_RESP.size, socket.MSG_WAITALL))
            assert status == ST_ERR and b"max_item_bytes" in s.recv(n, socket.MSG_WAITALL)
        with socket.create_connection(server.address, timeout=5) as s:
            s.sendall(_REQ.pack(MAGIC, OP_GET, 2, 0))
            assert struct.unpack("!4s", s.recv(_RESP.size, socket.MSG_WAITALL)[:4])[0] == MAGIC


def test_forked_child_opens_its_own_connections(counters) -> None:
    cache = DictCache(4)
    cache.items[2] = b"child"
    with PeerServer(cache, host="127.0.0.1") as server:
        client = PeerClient([server.address], counters=counters)
        assert client.get(0, 2) == b"child"
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            ok = client.get(0, 2) == b"child" and client._pid == os.getpid()
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert client.get(0, 2) == b"child"  # the parent's pooled connection is intact
    assert counters.snapshot()["remote_hits"] == 3


def test_server_cannot_be_pickled() -> None:
    import pickle

    with PeerServer(DictCache(1), host="127.0.0.1") as server, pytest.raises(TypeError):
        pickle.dumps(server)

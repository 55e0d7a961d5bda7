"""PeerServer / PeerClient: batched round trips, authentication, verified PUTs, bounds, dead peers, fork."""

from __future__ import annotations

import logging
import os
import socket
import time

import numpy as np
import pytest

from coordl.partitioned import protocol as P
from coordl.partitioned.auth import HELLO, NONCE_BYTES, AuthError, client_handshake, client_mac
from coordl.partitioned.peer import PEER_COUNTERS, PeerClient
from coordl.partitioned.server import PeerServer
from shmem import codec
from shmem.counters import SharedCounters

SECRET = b"s" * 32


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


def serve(cache, **kw) -> PeerServer:
    kw.setdefault("owns", lambda i: True)
    return PeerServer(cache, secret=SECRET, host="127.0.0.1", **kw)


@pytest.fixture
def counters():
    c = SharedCounters(PEER_COUNTERS)
    yield c
    c.close()


def test_get_hit_miss_and_large_item(counters) -> None:
    cache = DictCache(10)
    cache.items[3] = b"abc"
    cache.items[4] = os.urandom(3 << 20)
    with serve(cache) as server:
        client = PeerClient([server.address], secret=SECRET, counters=counters)
        assert client.get(0, 3) == b"abc"
        assert client.get(0, 4) == cache.items[4]
        assert client.get(0, 5) is None
        assert client.ping(0)
        client.close()
    snap = counters.snapshot()
    assert snap["remote_hits"] == 2 and snap["remote_misses"] == 1
    assert snap["remote_bytes"] == 3 + (3 << 20)
    assert snap["remote_errors"] == 0


def test_batched_fetch_is_one_request_per_peer(counters) -> None:
    caches = [DictCache(100), DictCache(100)]
    for i in range(100):
        caches[i % 2].items[i] = bytes([i]) * (i + 1)
    with serve(caches[0]) as s0, serve(caches[1]) as s1:
        client = PeerClient([s0.address, s1.address], secret=SECRET, counters=counters)
        wanted = {0: list(range(0, 100, 2)) + [1], 1: list(range(1, 100, 2))}
        got = client.fetch(wanted)
        assert sorted(got) == list(range(100))  # 1 is a miss on node 0, a hit on node 1
        assert all(bytes(got[i]) == bytes([i]) * (i + 1) for i in got)
        assert counters.snapshot()["remote_requests"] == 2
        assert s0.stats()["get_requests"] == 1 and s1.stats()["get_requests"] == 1


def test_reply_budget_splits_a_batch_without_losing_items(counters) -> None:
    cache = DictCache(20)
    for i in range(20):
        cache.items[i] = os.urandom(1000)
    with serve(cache, reply_budget=3500) as server:
        client = PeerClient([server.address], secret=SECRET, counters=counters)
        got = client.fetch({0: range(20)})
        assert {i: bytes(v) for i, v in got.items()} == cache.items
        assert server.stats()["get_requests"] == 7  # 3 items per reply


def test_put_stores_only_owned_items_of_the_right_length(counters) -> None:
    cache = DictCache(10)
    with serve(cache, owns=lambda i: i % 2 == 0, item_size=lambda i: 4) as server:
        client = PeerClient([server.address], secret=SECRET, counters=counters)
        assert client.put(0, 2, b"even")
        assert not client.put(0, 3, b"odd!")  # not this node's: refused
        assert not client.put(0, 4, b"toolong")  # wrong length: refused
        assert not client.put(0, 99, b"xxxx")  # outside the dataset
        assert client.get(0, 2) == b"even"
        assert 3 not in cache.items and 4 not in cache.items and 99 not in cache.items
        stats = server.stats()
        assert stats["puts_stored"] == 1 and stats["puts_refused_not_owner"] == 2
        assert stats["puts_refused_length"] == 1
        assert not client.is_down(0)  # a refusal is an answer, not a failure


def test_dead_peer_is_marked_down_and_warned_once(counters, caplog) -> None:
    cache = DictCache(4)
    cache.items[1] = b"x"
    server = serve(cache)
    client = PeerClient([server.address], secret=SECRET, counters=counters, backoff_s=60)
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
    server = serve(cache)
    port = server.address[1]
    server.stop()
    client = PeerClient([("127.0.0.1", port)], secret=SECRET, counters=counters, backoff_s=0.2)
    assert client.get(0, 0) is None and client.is_down(0)
    try:
        server = serve(cache, port=port)
    except OSError:
        pytest.skip("the freed port was taken by another process")
    with server:
        time.sleep(0.3)
        assert client.get(0, 0) == b"back"


def test_silent_peer_times_out(counters) -> None:
    # A listener that never answers: a peer cut off from the network, not dead.
    silent = socket.create_server(("127.0.0.1", 0))
    try:
        client = PeerClient(
            [silent.getsockname()[:2]], secret=SECRET, counters=counters, connect_timeout_s=0.3, backoff_s=60
        )
        t0 = time.monotonic()
        assert client.get(0, 1) is None
        assert time.monotonic() - t0 < 5
        assert client.is_down(0)
    finally:
        silent.close()
    assert counters.snapshot()["remote_errors"] == 1


def test_forked_child_opens_its_own_connections(counters) -> None:
    cache = DictCache(4)
    cache.items[2] = b"child"
    with serve(cache) as server:
        client = PeerClient([server.address], secret=SECRET, counters=counters)
        assert client.get(0, 2) == b"child"
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            ok = client.get(0, 2) == b"child" and client._pid == os.getpid()
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert client.get(0, 2) == b"child"  # the parent's pooled connection is intact
    assert counters.snapshot()["remote_hits"] == 3


def test_server_cannot_be_pickled_and_binds_loopback_by_default() -> None:
    import pickle

    with PeerServer(DictCache(1), secret=SECRET, owns=lambda i: True) as server:
        assert server.address[0] == "127.0.0.1"
        with pytest.raises(TypeError):
            pickle.dumps(server)


def test_short_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        PeerServer(DictCache(1), secret=b"short", owns=lambda i: True)


# -- authentication ------------------------------------------------------------------------------------


def test_wrong_secret_is_refused_both_ways(counters) -> None:
    cache = DictCache(4)
    cache.items[0] = b"secret data"
    with serve(cache) as server:
        intruder = PeerClient([server.address], secret=b"w" * 32, counters=counters, backoff_s=60)
        assert intruder.get(0, 0) is None and intruder.is_down(0)
        assert not intruder.put(0, 1, b"poison")
        with socket.create_connection(server.address, timeout=5) as s, pytest.raises(AuthError):
            client_handshake(s, b"w" * 32)
        deadline = time.monotonic() + 5
        while server.stats()["auth_failures"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.stats()["auth_failures"] == 2
        assert 1 not in cache.items
        assert PeerClient([server.address], secret=SECRET).get(0, 0) == b"secret data"


def test_replayed_handshake_is_refused() -> None:
    with serve(DictCache(4)) as server:
        with socket.create_connection(server.address, timeout=5) as s:
            hello = s.recv(len(HELLO) + NONCE_BYTES, socket.MSG_WAITALL)
            client_nonce = os.urandom(NONCE_BYTES)
            captured = client_nonce + client_mac(SECRET, hello[len(HELLO) :], client_nonce)
            s.sendall(captured)
            assert len(s.recv(32, socket.MSG_WAITALL)) == 32  # accepted on its own connection
        with socket.create_connection(server.address, timeout=5) as s:
            s.recv(len(HELLO) + NONCE_BYTES, socket.MSG_WAITALL)  # a fresh nonce
            s.sendall(captured)  # the recorded answer to the old nonce
            assert _closed(s)
        assert server.stats()["auth_failures"] == 1


def test_server_that_lacks_the_secret_is_refused_by_the_client() -> None:
    impostor = socket.create_server(("127.0.0.1", 0))
    try:

        def fake(conn: socket.socket) -> None:
            conn.sendall(HELLO + os.urandom(NONCE_BYTES))
            conn.recv(64, socket.MSG_WAITALL)
            conn.sendall(os.urandom(32))  # cannot compute the server MAC

        import threading

        def accept() -> None:
            conn, _ = impostor.accept()
            with conn:
                fake(conn)

        t = threading.Thread(target=accept, daemon=True)
        t.start()
        with socket.create_connection(impostor.getsockname()[:2], timeout=5) as s, pytest.raises(AuthError):
            client_handshake(s, SECRET)
        t.join(5)
    finally:
        impostor.close()


# -- bad input on an authenticated or unauthenticated connection -----------------------------------------


def _closed(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def _authed(server: PeerServer) -> socket.socket:
    s = socket.create_connection(server.address, timeout=5)
    client_handshake(s, SECRET)
    return s


def _reply(s: socket.socket) -> tuple[int, object]:
    prefix = s.recv(codec.PREFIX_BYTES, socket.MSG_WAITALL)
    rest = s.recv(codec.frame_size(prefix) - len(prefix), socket.MSG_WAITALL)
    return codec.read_prefix(prefix).kind, codec.decode(prefix + rest, P.FRAME_KEY)


@pytest.mark.parametrize(
    "payload",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"x" * 40,  # garbage, longer than a handshake
        b"\0" * 64,  # zeros as the handshake answer
    ],
)
def test_garbage_before_authentication_closes(payload: bytes) -> None:
    with serve(DictCache(4)) as server, socket.create_connection(server.address, timeout=5) as s:
        assert s.recv(len(HELLO) + NONCE_BYTES, socket.MSG_WAITALL)[:4] == HELLO
        s.sendall(payload)
        assert _closed(s)
        assert server.stats()["auth_failures"] == 1


def test_bad_frames_after_authentication_close_the_connection() -> None:
    cache = DictCache(4)
    cache.items[0] = b"ok"
    with serve(cache, max_item_bytes=1000) as server:
        good = codec.encode({"i": np.array([0])}, P.FRAME_KEY, kind=P.OP_GET)
        wrong_magic = b"XXXX" + good[4:]
        huge = codec.encode({"i": 0, "data": b"x" * 200_000}, P.FRAME_KEY, kind=P.OP_PUT)  # > max request
        wrong_key = codec.encode({"i": np.array([0])}, b"other", kind=P.OP_GET)
        for bad in (wrong_magic, good[:30], good[:-3], huge, wrong_key, os.urandom(200)):
            with _authed(server) as s:
                try:
                    s.sendall(bad)
                    s.shutdown(socket.SHUT_WR)  # a truncated frame then ends: the server sees EOF
                except OSError:
                    pass  # the server closed first (it refuses a frame from its prefix alone)
                assert _closed(s)
        with _authed(server) as s:  # the server still serves
            s.sendall(good)
            status, tree = _reply(s)
            assert status == P.ST_OK and bytes(tree["items"][0]) == b"ok"
        assert server.stats()["bad_frames"] >= 4


def test_put_with_a_wrong_checksum_is_refused_and_not_stored() -> None:
    cache = DictCache(4)
    with serve(cache) as server, _authed(server) as s:
        frame = bytearray(codec.encode({"i": 1, "data": b"good bytes"}, P.FRAME_KEY, kind=P.OP_PUT))
        frame[-3] ^= 0xFF  # damage a payload byte: the frame's payload CRC no longer matches
        s.sendall(frame)
        status, tree = _reply(s)
        assert status == P.ST_ERR and "payload crc" in tree["error"]
        assert 1 not in cache.items and server.stats()["puts_refused_checksum"] == 1


def test_silent_connection_is_closed_after_the_auth_timeout() -> None:
    with (
        serve(DictCache(4), auth_timeout_s=0.3) as server,
        socket.create_connection(server.address, timeout=5) as s,
    ):
        s.recv(len(HELLO) + NONCE_BYTES, socket.MSG_WAITALL)
        assert _closed(s)  # within auth_timeout_s plus one sweep of the loop (0.5 s)
        assert server.stats()["timeouts"] == 1


def test_a_thousand_connections_at_once_are_bounded_and_the_server_keeps_serving() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2300:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    cache = DictCache(4)
    cache.items[0] = b"still here"
    with serve(cache, max_connections=64, auth_timeout_s=30) as server:
        socks = []
        try:
            for _ in range(1000):
                socks.append(socket.create_connection(server.address, timeout=5))
            deadline = time.monotonic() + 10
            while sum(server.stats()[k] for k in ("conns_accepted", "conns_refused_full")) < 1000:
                assert time.monotonic() < deadline, server.stats()
                time.sleep(0.02)
            stats = server.stats()
            assert stats["conns_accepted"] == 64 and stats["conns_refused_full"] == 936
            assert PeerClient([server.address], secret=SECRET).get(0, 0) is None  # full: refused too
        finally:
            for s in socks:
                s.close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the server notices the closes and frees the slots
            if PeerClient([server.address], secret=SECRET).get(0, 0) == b"still here":
                break
            time.sleep(0.1)
        else:
            pytest.fail("the server did not serve again after the flood")


def test_trickling_handshakes_do_not_tie_up_the_workers() -> None:
    """Connections that send their handshake a byte at a time are handled by the event loop, not the
    one worker: a legitimate client is served while twenty of them wait."""
    cache = DictCache(4)
    cache.items[1] = b"served"
    with serve(cache, workers=1, auth_timeout_s=30) as server:
        slow = []
        try:
            for _ in range(20):
                s = socket.create_connection(server.address, timeout=5)
                s.recv(len(HELLO) + NONCE_BYTES, socket.MSG_WAITALL)
                s.sendall(b"\x01")  # 1 of 64 bytes
                slow.append(s)
            client = PeerClient([server.address], secret=SECRET, timeout_s=2, connect_timeout_s=2)
            assert client.get(0, 1) == b"served"
        finally:
            for s in slow:
                s.close()

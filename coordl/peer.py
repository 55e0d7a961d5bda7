"""The per-node cache server and its client: raw item bytes over TCP, length-prefixed, never pickled.

In a partitioned cache each node serves the items it owns to the other nodes. The wire format is a
fixed header and raw bytes, so a reachable port can never make a process run code it received:

    request   magic "CDP1" | op u8 | pad x3 | index u64 | length u64 | payload (PUT only: item bytes)
    response  magic "CDP1" | status u8 | pad x3 | length u64 | payload (HIT: item bytes, ERR: utf-8 text)

Ops: GET (HIT or MISS), PUT (store an item the server's node owns; OK), PING (OK). A connection
carries any number of requests, one at a time. The client keeps a small pool of connections per peer
and per process (forked or spawned DataLoader workers open their own, lazily), bounds every wait with a
timeout, and marks a peer down for ``backoff_s`` after an error, so that a dead or cut-off node costs
the job one timeout, not one per item: its items then come from storage.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["PeerServer", "PeerClient", "PeerError", "PEER_COUNTERS", "advertise_address"]

log = logging.getLogger("coordl")

MAGIC = b"CDP1"
_REQ = struct.Struct("!4sB3xQQ")
_RESP = struct.Struct("!4sB3xQ")
OP_GET, OP_PUT, OP_PING = 1, 2, 3
ST_HIT, ST_MISS, ST_OK, ST_ERR = 0, 1, 2, 3
_IDLE_TIMEOUT_S = 600.0  # a server closes a connection that sent nothing for this long

PEER_COUNTERS = (
    "remote_hits",
    "remote_misses",
    "remote_bytes",
    "remote_errors",
    "remote_pushes",
    "remote_skipped_down",
)


class PeerError(ConnectionError):
    """A peer broke the protocol or answered with an error (the message names the peer)."""


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionResetError(f"peer closed the connection after {got} of {n} bytes")
        got += k
    return buf


class PeerServer:
    """Serves a node's cache to its peers from threads of the calling process.

    Args:
        cache: an object with ``get(index) -> bytes | memoryview | None`` and ``put(index, raw)``
            (a :class:`coordl.minio.MinioCache`) and ``num_items``.
        host: address to listen on (default all interfaces of this network namespace).
        port: 0 lets the OS pick a free port (read it from :attr:`address`).
        accepts: which indices a PUT may store (default: none: PUT is answered but ignored).
        max_item_bytes: a PUT larger than this is refused (guards memory against a bad client).
    """

    def __init__(
        self,
        cache: Any,
        *,
        host: str = "0.0.0.0",
        port: int = 0,
        accepts: Callable[[int], bool] | None = None,
        max_item_bytes: int = 1 << 30,
    ) -> None:
        self.cache = cache
        self.accepts = accepts
        self.max_item_bytes = max_item_bytes
        self._sock = socket.create_server((host, port), backlog=128)
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._owner_pid = os.getpid()
        self._thread = threading.Thread(target=self._accept_loop, name="coordl-peer-server", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed by stop()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(_IDLE_TIMEOUT_S)
            with self._lock:
                if self._stopped.is_set():
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="coordl-peer-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            while True:
                head = conn.recv(_REQ.size, socket.MSG_WAITALL)
                if len(head) < _REQ.size:
                    return  # client closed
                magic, op, index, length = _REQ.unpack(head)
                if magic != MAGIC:
                    return  # not our protocol: drop the connection without answering
                if not self._answer(conn, op, index, length):
                    return
        except OSError:
            return
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _answer(self, conn: socket.socket, op: int, index: int, length: int) -> bool:
        n = self.cache.num_items
        if op == OP_PING:
            conn.sendall(_RESP.pack(MAGIC, ST_OK, 0))
            return True
        if op == OP_PUT:
            if length > self.max_item_bytes:
                self._error(conn, f"PUT of {length} bytes exceeds max_item_bytes={self.max_item_bytes}")
                return False  # the payload is not read: the stream cannot continue
            raw = _recv_exact(conn, length)
            if 0 <= index < n and self.accepts is not None and self.accepts(index):
                self.cache.put(index, raw)
            conn.sendall(_RESP.pack(MAGIC, ST_OK, 0))
            return True
        if op != OP_GET:
            self._error(conn, f"unknown op {op}")
            return False
        if not 0 <= index < n:
            self._error(conn, f"item {index} is outside this cache's 0..{n - 1}")
            return True
        raw = self.cache.get(index)
        if raw is None:
            conn.sendall(_RESP.pack(MAGIC, ST_MISS, 0))
        else:
            conn.sendall(_RESP.pack(MAGIC, ST_HIT, len(raw)))
            conn.sendall(raw)  # a view of the cache: sent without a copy
        return True

    @staticmethod
    def _error(conn: socket.socket, message: str) -> None:
        body = message.encode()
        conn.sendall(_RESP.pack(MAGIC, ST_ERR, len(body)) + body)

    def stop(self) -> None:
        """Stop listening and drop every connection (peers then fall back to storage). Idempotent.

        ``shutdown`` (not only ``close``) because forked DataLoader workers hold copies of the
        descriptors: shutting the socket down ends it for every copy.
        """
        if os.getpid() != self._owner_pid or self._stopped.is_set():
            return
        self._stopped.set()
        for sock in [self._sock, *self._snapshot_conns()]:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        self._thread.join(timeout=5)

    def _snapshot_conns(self) -> list[socket.socket]:
        with self._lock:
            conns = list(self._conns)
            self._conns.clear()
        return conns

    def __enter__(self) -> PeerServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __getstate__(self) -> dict:
        raise TypeError("PeerServer runs in the process that created it and cannot be pickled")


class PeerClient:
    """Fetches items from peers' :class:`PeerServer`; safe to copy into DataLoader workers.

    Args:
        addresses: ``(host, port)`` of each node's server, indexed by node (None: no server).
        counters: optional :class:`coordl.counters.SharedCounters` holding :data:`PEER_COUNTERS`.
        timeout_s: limit on each request's wait for the peer (connect, send, and each receive).
        connect_timeout_s: limit on opening a connection.
        backoff_s: after an error a peer is not asked again for this long (per process).
    """

    def __init__(
        self,
        addresses: Sequence[tuple[str, int] | None],
        *,
        counters: Any = None,
        timeout_s: float = 10.0,
        connect_timeout_s: float = 3.0,
        backoff_s: float = 30.0,
    ) -> None:
        self.addresses = [tuple(a) if a is not None else None for a in addresses]
        self.counters = counters
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.backoff_s = backoff_s
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._idle: dict[int, list[socket.socket]] = {}
        self._down_until: dict[int, float] = {}
        self._warned: set[int] = set()
        self._lock = threading.Lock()

    def _check_pid(self) -> None:
        if self._pid != os.getpid():
            # A forked child must not share its parent's sockets: the byte streams would interleave.
            self._reset()

    # -- public --------------------------------------------------------------------------------------

    def is_down(self, node: int) -> bool:
        self._check_pid()
        return time.monotonic() < self._down_until.get(node, 0.0)

    def get(self, node: int, index: int) -> bytes | None:
        """Item ``index`` from node ``node``'s cache; None on a miss, an error, or while it is down."""
        reply = self._call(node, OP_GET, index)
        if reply is None:
            return None
        status, body = reply
        if status == ST_HIT:
            self._count({"remote_hits": 1, "remote_bytes": len(body)})
            return bytes(body)
        self._count({"remote_misses": 1})
        return None

    def put(self, node: int, index: int, raw: bytes | memoryview) -> bool:
        """Give node ``node`` an item it owns (it caches it if it has room). False on error or down."""
        ok = self._call(node, OP_PUT, index, raw) is not None
        if ok:
            self._count({"remote_pushes": 1})
        return ok

    def ping(self, node: int) -> bool:
        return self._call(node, OP_PING, 0) is not None

    def close(self) -> None:
        """Close this process's pooled connections."""
        self._check_pid()
        with self._lock:
            for socks in self._idle.values():
                for s in socks:
                    s.close()
            self._idle.clear()

    # -- internals -----------------------------------------------------------------------------------

    def _count(self, amounts: dict[str, int]) -> None:
        if self.counters is not None:
            self.counters.add_many(amounts)

    def _call(
        self, node: int, op: int, index: int, payload: bytes | memoryview | None = None
    ) -> tuple | None:
        self._check_pid()
        addr = self.addresses[node] if 0 <= node < len(self.addresses) else None
        if addr is None:
            return None
        if self.is_down(node):
            self._count({"remote_skipped_down": 1})
            return None
        # A pooled connection may have been closed by the peer since its last use: one retry on a
        # fresh connection tells "stale connection" from "peer is gone".
        for attempt in range(2):
            sock, reused = self._checkout(node, addr)
            try:
                if sock is None:
                    raise ConnectionError("no connection")
                reply = self._exchange(sock, op, index, payload)
            except (OSError, PeerError) as exc:
                if sock is not None:
                    sock.close()
                if reused and attempt == 0 and not isinstance(exc, (TimeoutError, PeerError)):
                    continue
                self._mark_down(node, addr, exc)
                return None
            self._checkin(node, sock)
            if reply[0] == ST_ERR:
                self._count({"remote_errors": 1})
                log.warning("coordl: peer node %d at %s:%d: %s", node, *addr, bytes(reply[1]).decode())
                return None
            return reply
        return None

    def _exchange(
        self, sock: socket.socket, op: int, index: int, payload: bytes | memoryview | None
    ) -> tuple:
        length = 0 if payload is None else len(payload)
        sock.sendall(_REQ.pack(MAGIC, op, index, length))
        if payload is not None:
            sock.sendall(payload)
        head = _recv_exact(sock, _RESP.size)
        magic, status, n = _RESP.unpack(head)
        if magic != MAGIC or status not in (ST_HIT, ST_MISS, ST_OK, ST_ERR):
            raise PeerError(f"bad reply header {bytes(head)!r}")
        body = _recv_exact(sock, n) if n else bytearray()
        return status, body

    def _checkout(self, node: int, addr: tuple[str, int]) -> tuple[socket.socket | None, bool]:
        with self._lock:
            pool = self._idle.get(node)
            if pool:
                return pool.pop(), True
        try:
            sock = socket.create_connection(addr, timeout=self.connect_timeout_s)
        except OSError as exc:
            self._mark_down(node, addr, exc)
            return None, False
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.timeout_s)
        return sock, False

    def _checkin(self, node: int, sock: socket.socket) -> None:
        with self._lock:
            self._idle.setdefault(node, []).append(sock)

    def _mark_down(self, node: int, addr: tuple[str, int], exc: BaseException) -> None:
        if self.is_down(node):
            return  # _checkout already counted this failure
        self._down_until[node] = time.monotonic() + self.backoff_s
        self._count({"remote_errors": 1})
        if node not in self._warned:  # warn once per peer per process: the stats keep counting
            self._warned.add(node)
            log.warning(
                "coordl: peer node %d at %s:%d failed (%s: %s); its items come from storage for the next "
                "%.0f s",
                node, addr[0], addr[1], type(exc).__name__, exc, self.backoff_s,
            )  # fmt: skip

    def __getstate__(self) -> dict:
        return {
            "addresses": self.addresses,
            "counters": self.counters,
            "timeout_s": self.timeout_s,
            "connect_timeout_s": self.connect_timeout_s,
            "backoff_s": self.backoff_s,
        }

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()


def advertise_address(env: dict[str, str] | None = None) -> str:
    """The address peers should use to reach this process's server.

    ``COORDL_PEER_ADDR`` when set; else the address of the interface gloo was told to use
    (``GLOO_SOCKET_IFNAME``); else the source address the routing table picks towards ``MASTER_ADDR``
    (a UDP socket's ``connect`` sends nothing); else 127.0.0.1.
    """
    env = os.environ if env is None else env
    if env.get("COORDL_PEER_ADDR"):
        return env["COORDL_PEER_ADDR"]
    ifname = (env.get("GLOO_SOCKET_IFNAME") or "").split(",")[0].strip()
    if ifname:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                req = struct.pack("256s", ifname.encode()[:15])
                return socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])  # SIOCGIFADDR
            except OSError as exc:
                raise OSError(f"GLOO_SOCKET_IFNAME={ifname!r} has no IPv4 address here: {exc}") from exc
    master = env.get("MASTER_ADDR")
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((master, 9))
                return s.getsockname()[0]
        except OSError:
            pass
    return "127.0.0.1"

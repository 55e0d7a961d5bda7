"""The client of the nodes' cache servers: batched, authenticated fetches of raw item bytes; never pickled.

In a partitioned cache each node serves the items it owns to the other nodes
(:class:`coordl.partitioned.server.PeerServer`). A worker asks each owner for all of a batch's items it
owns in one request, and sends the requests to every owner before reading any reply, so a batch costs
one round trip in all, not one per item or per peer. Messages are :mod:`shmem.codec` frames
(:mod:`coordl.partitioned.protocol`); every connection starts with the challenge-response of
:mod:`coordl.partitioned.auth`, which also proves the server holds the job's secret.

The client keeps a small pool of connections per peer and per process (forked or spawned DataLoader
workers open their own, lazily), bounds every wait with a timeout, and marks a peer down for
``backoff_s`` after an error, so that a dead or cut-off node costs the job one timeout, not one per item:
its items then come from storage.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from coordl.partitioned import protocol as P
from coordl.partitioned.auth import AuthError, client_handshake
from coordl.partitioned.protocol import PEER_COUNTERS, recv_frame
from shmem import codec

__all__ = ["PeerClient", "PeerError", "PEER_COUNTERS", "advertise_address"]

log = logging.getLogger("coordl")


class PeerError(ConnectionError):
    """A peer broke the protocol or answered with an error (the message names the peer)."""


class PeerClient:
    """Fetches items from peers' servers; safe to copy into DataLoader workers.

    Args:
        addresses: ``(host, port)`` of each node's server, indexed by node (None: no server).
        secret: the job's peer secret (see :mod:`coordl.partitioned.auth`).
        counters: optional :class:`shmem.counters.SharedCounters` holding :data:`PEER_COUNTERS`.
        timeout_s: limit on each request's wait for the peer (send, and each receive).
        connect_timeout_s: limit on opening and authenticating a connection.
        backoff_s: after an error a peer is not asked again for this long (per process).
        max_reply_bytes: the largest reply accepted: the servers' reply budget, plus one item that may
            exceed it alone (a reply always carries at least one item), plus overhead.
    """

    def __init__(
        self,
        addresses: Sequence[tuple[str, int] | None],
        *,
        secret: bytes,
        counters: Any = None,
        timeout_s: float = 10.0,
        connect_timeout_s: float = 3.0,
        backoff_s: float = 30.0,
        max_reply_bytes: int = P.DEFAULT_REPLY_BUDGET + P.FRAME_OVERHEAD + (256 << 20),
    ) -> None:
        self.addresses = [tuple(a) if a is not None else None for a in addresses]
        self.secret = bytes(secret)
        self.counters = counters
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.backoff_s = backoff_s
        self.max_reply_bytes = max_reply_bytes
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

    def get(self, node: int, index: int) -> memoryview | None:
        """Item ``index`` from node ``node``'s cache; None on a miss, an error, or while it is down."""
        return self.fetch({node: [index]}).get(index)

    def fetch(self, wanted: dict[int, Iterable[int]]) -> dict[int, memoryview]:
        """The items each node in ``wanted`` has of those asked: one request per node, all sent first.

        Returns the hits by index (views of the reply buffers); misses, errors and down peers are
        simply absent (the caller reads them from storage).
        """
        self._check_pid()
        pending: dict[int, np.ndarray] = {}
        for node, indices in wanted.items():
            idx = np.unique(np.fromiter(indices, dtype=np.int64))
            if len(idx):
                pending[node] = idx
        out: dict[int, memoryview] = {}
        while pending:
            more: dict[int, np.ndarray] = {}
            sent: list[tuple[int, socket.socket, bool, np.ndarray]] = []
            for node, idx in pending.items():
                for start in range(0, len(idx), P.MAX_GET_ITEMS):
                    chunk = idx[start : start + P.MAX_GET_ITEMS]
                    sock, reused = self._send(node, _get_frame(chunk))
                    if sock is not None:
                        sent.append((node, sock, reused, chunk))
            for node, sock, reused, chunk in sent:
                reply = self._receive(
                    node, sock, reused, lambda n=node, c=chunk: self._send(n, _get_frame(c))
                )
                if reply is None:
                    continue
                hits, rest = self._take_hits(reply, chunk, out)
                if len(rest):
                    more[node] = np.concatenate([more.get(node, rest[:0]), rest])
                self._count({"remote_hits": hits, "remote_misses": len(chunk) - hits - len(rest)})
            pending = more
        return out

    def put(self, node: int, index: int, raw: bytes | memoryview) -> bool:
        """Give node ``node`` an item it owns. False when refused, on error, or while it is down."""
        self._check_pid()
        sock, reused = self._send(node, _put_frame(index, raw))
        if sock is None:
            return False
        reply = self._receive(node, sock, reused, lambda: self._send(node, _put_frame(index, raw)))
        if reply is None:
            return False
        self._count({"remote_pushes": 1})
        return bool(reply[1].get("stored")) if isinstance(reply[1], dict) else False

    def put_many(self, node: int, items: Any) -> int:
        return sum(self.put(node, i, raw) for i, raw in items)

    def ping(self, node: int) -> bool:
        self._check_pid()
        frame = codec.encode(None, P.FRAME_KEY, kind=P.OP_PING)
        sock, reused = self._send(node, frame)
        return (
            sock is not None
            and self._receive(node, sock, reused, lambda: self._send(node, frame)) is not None
        )

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
            self.counters.add_many({k: v for k, v in amounts.items() if v})

    def _send(self, node: int, frame: bytes) -> tuple[socket.socket | None, bool]:
        """Send ``frame`` to ``node`` on a pooled or fresh connection; (None, False) when it cannot."""
        addr = self.addresses[node] if 0 <= node < len(self.addresses) else None
        if addr is None:
            return None, False
        if self.is_down(node):
            self._count({"remote_skipped_down": 1})
            return None, False
        # A pooled connection may have been closed by the peer since its last use: one retry on a
        # fresh connection tells "stale connection" from "peer is gone".
        for _ in range(2):
            sock, reused = self._checkout(node, addr)
            if sock is None:
                return None, False
            try:
                sock.sendall(frame)
            except OSError as exc:
                sock.close()
                if reused:
                    continue
                self._mark_down(node, exc)
                return None, False
            self._count({"remote_requests": 1})
            return sock, reused
        return None, False

    def _receive(self, node: int, sock: socket.socket, reused: bool, resend: Any) -> tuple[int, Any] | None:
        """The reply on ``sock`` as (status, tree); None on an error (the peer is then marked down)."""
        try:
            reply = self._read_reply(sock)
        except (OSError, PeerError, codec.CodecError) as exc:
            sock.close()
            stale = (
                reused and isinstance(exc, ConnectionError) and not isinstance(exc, (AuthError, PeerError))
            )
            if stale:  # the pooled connection was closed under us: ask once more on a fresh one
                sock, _ = resend()
                return None if sock is None else self._receive(node, sock, False, resend)
            self._mark_down(node, exc)
            return None
        self._checkin(node, sock)
        if reply[0] != P.ST_OK:
            self._count({"remote_errors": 1})
            msg = reply[1].get("error") if isinstance(reply[1], dict) else reply[1]
            log.warning("coordl: peer node %d at %s:%d: %s", node, *self.addresses[node], msg)
            return None
        return reply

    def _read_reply(self, sock: socket.socket) -> tuple[int, Any]:
        frame = recv_frame(sock, self.max_reply_bytes)
        status = codec.read_prefix(frame).kind
        if status not in (P.ST_OK, P.ST_ERR):
            raise PeerError(f"unknown reply status {status}")
        return status, codec.decode(frame, P.FRAME_KEY, max_payload=self.max_reply_bytes)

    def _take_hits(
        self, reply: tuple[int, Any], asked: np.ndarray, out: dict[int, memoryview]
    ) -> tuple[int, np.ndarray]:
        """Move a GET reply's items into ``out``; returns (hits, indices to ask again)."""
        tree = reply[1]
        try:
            hit, items, more = tree["hit"], tree["items"], tree["more"]
            ok = len(hit) == len(items) and all(isinstance(v, memoryview) for v in items)
        except (KeyError, TypeError):
            ok = False
        asked_set = set(asked.tolist())  # (np.isin costs ~30 us a call: too much for one-item requests)
        if not ok or not asked_set.issuperset(hit.tolist()) or not asked_set.issuperset(more.tolist()):
            self._count({"remote_errors": 1})
            return 0, asked[:0]
        nbytes = 0
        for i, raw in zip(hit.tolist(), items, strict=True):
            out[i] = raw
            nbytes += len(raw)
        self._count({"remote_bytes": nbytes})
        return len(hit), np.asarray(more, dtype=np.int64)

    def _checkout(self, node: int, addr: tuple[str, int]) -> tuple[socket.socket | None, bool]:
        with self._lock:
            pool = self._idle.get(node)
            if pool:
                return pool.pop(), True
        try:
            sock = socket.create_connection(addr, timeout=self.connect_timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client_handshake(sock, self.secret)
        except OSError as exc:
            self._mark_down(node, exc)
            return None, False
        sock.settimeout(self.timeout_s)
        return sock, False

    def _checkin(self, node: int, sock: socket.socket) -> None:
        with self._lock:
            self._idle.setdefault(node, []).append(sock)

    def _mark_down(self, node: int, exc: BaseException) -> None:
        if self.is_down(node):
            return  # already counted
        self._down_until[node] = time.monotonic() + self.backoff_s
        self._count({"remote_errors": 1})
        if node not in self._warned:  # warn once per peer per process: the stats keep counting
            self._warned.add(node)
            addr = self.addresses[node] or ("?", 0)
            log.warning(
                "coordl: peer node %d at %s:%d failed (%s: %s); its items come from storage for the next "
                "%.0f s",
                node, addr[0], addr[1], type(exc).__name__, exc, self.backoff_s,
            )  # fmt: skip

    def __getstate__(self) -> dict:
        return {
            "addresses": self.addresses,
            "secret": self.secret,
            "counters": self.counters,
            "timeout_s": self.timeout_s,
            "connect_timeout_s": self.connect_timeout_s,
            "backoff_s": self.backoff_s,
            "max_reply_bytes": self.max_reply_bytes,
        }

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()


def _get_frame(indices: np.ndarray) -> bytes:
    return codec.encode({"i": indices}, P.FRAME_KEY, kind=P.OP_GET)


def _put_frame(index: int, raw: bytes | memoryview) -> bytes:
    return codec.encode({"i": int(index), "data": raw}, P.FRAME_KEY, kind=P.OP_PUT)


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

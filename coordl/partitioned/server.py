"""A node's cache server for its peers: authenticated, bounded, and storing only verified items it owns.

One event-loop thread watches the listening socket and every idle connection (``selectors``); a fixed
pool of ``workers`` threads handles a connection only while it has a request to answer, then gives it
back to the loop. So a thousand idle or silent connections cost a thousand file descriptors, not a
thousand threads, and at most ``max_connections`` are held open (the others are closed on accept).

Memory bound, stated: each worker holds at most one request (``max_request_bytes``: one item of the
dataset plus :data:`~coordl.partitioned.protocol.FRAME_OVERHEAD`); a GET reply is sent with ``sendmsg``
straight from the cache's views, so it adds only its header. The server's buffers stay under
``workers * max_request_bytes`` (4 workers and 1 MiB items: ~4.3 MiB; ~0 when idle), plus ~1 KiB of
kernel and Python state per open connection (at most ``max_connections``).

Every connection must pass the challenge-response of :mod:`coordl.partitioned.auth` within
``auth_timeout_s`` before any request is read; a connection that fails it is closed. A PUT is stored only
when the item is this node's (``owns``), its length is the dataset's length for it (``item_size``, else
at most ``max_item_bytes``) and its frame's CRC checks out; a refused PUT is counted and answered with an
error, never stored.
"""

from __future__ import annotations

import hmac
import logging
import os
import queue
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from coordl.partitioned import protocol as P
from coordl.partitioned.auth import HELLO, MAC_BYTES, NONCE_BYTES, client_mac, server_mac
from coordl.partitioned.protocol import recv_frame, send_parts
from shmem import codec

__all__ = ["PeerServer", "bind_listener"]

log = logging.getLogger("coordl")


def bind_listener(host: str = "127.0.0.1", port: int = 0, backlog: int = 128) -> socket.socket:
    """The listening socket of a node's server, bound to ``host`` (never all interfaces unless asked).

    Made before the server so its port can be exchanged with the peers first and the server built
    afterwards, complete, with the job's owner map.
    """
    return socket.create_server((host, port), backlog=backlog)


class _Conn:
    """One accepted connection and where it stands."""

    __slots__ = ("sock", "nonce", "authed", "deadline", "answer")

    def __init__(self, sock: socket.socket, nonce: bytes, deadline: float) -> None:
        self.sock = sock
        self.nonce = nonce
        self.authed = False
        self.answer = bytearray()  # the client's handshake answer as it arrives
        self.deadline = deadline


class PeerServer:
    """Serves a node's cache to its peers (see the module docstring for the guarantees).

    Args:
        cache: ``get(index) -> bytes | memoryview | None``, ``put(index, raw)`` and ``num_items``
            (a :class:`coordl.fetch.minio.MinioCache`).
        secret: the job's peer secret (:mod:`coordl.partitioned.auth`).
        owns: whether this node owns item ``index`` (a PUT of any other item is refused).
        listener: a socket from :func:`bind_listener`; when None one is bound to ``host:port``.
        item_size: the dataset's length of item ``index`` in bytes, when known: a PUT must match it.
        max_item_bytes: the largest item a PUT may carry (without ``item_size``: the cache's capacity
            is a natural bound). Sets the request size limit; nothing larger is ever read.
        max_connections: connections held open at once; more are closed at accept.
        workers: threads answering requests (the concurrency, and the memory bound, of the server).
        auth_timeout_s: a connection that has not authenticated by then is closed.
        idle_timeout_s: an authenticated connection that sends nothing for this long is closed.
        read_timeout_s: limit on each wait for the rest of a request once it has started.
        reply_budget: bytes of items in one GET reply (the rest are named in ``more``).
    """

    def __init__(
        self,
        cache: Any,
        *,
        secret: bytes,
        owns: Callable[[int], bool],
        listener: socket.socket | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        item_size: Callable[[int], int] | None = None,
        max_item_bytes: int = 64 << 20,
        max_connections: int = 256,
        workers: int = 4,
        auth_timeout_s: float = 5.0,
        idle_timeout_s: float = 600.0,
        read_timeout_s: float = 10.0,
        reply_budget: int = P.DEFAULT_REPLY_BUDGET,
    ) -> None:
        if len(secret) < 16:
            raise ValueError("PeerServer: the secret must be at least 16 bytes")
        self.cache = cache
        self.secret = bytes(secret)
        self.owns = owns
        self.item_size = item_size
        self.max_item_bytes = int(max_item_bytes)
        self.max_request_bytes = self.max_item_bytes + P.FRAME_OVERHEAD
        self.max_connections = max_connections
        self.auth_timeout_s = auth_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.read_timeout_s = read_timeout_s
        self.reply_budget = reply_budget
        self.counts = dict.fromkeys(P.SERVER_COUNTERS, 0)
        self._count_lock = threading.Lock()
        self._sock = listener if listener is not None else bind_listener(host, port)
        self._sock.setblocking(False)
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        self._owner_pid = os.getpid()
        self._stopped = threading.Event()
        self._conns: dict[int, _Conn] = {}  # fileno -> connection; touched by the loop thread only
        self._returned: queue.SimpleQueue = queue.SimpleQueue()  # connections the workers hand back
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._sock, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="coordl-peer-worker")
        self._thread = threading.Thread(target=self._loop, name="coordl-peer-server", daemon=True)
        self._thread.start()

    # -- the event loop ------------------------------------------------------------------------------

    def _count(self, key: str, n: int = 1) -> None:
        with self._count_lock:
            self.counts[key] += n

    def _loop(self) -> None:
        while not self._stopped.is_set():
            for key, _ in self._sel.select(timeout=0.5):
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    self._drain_wake()
                elif not key.data.authed:
                    self._authenticate(key.data)
                else:
                    conn = key.data
                    self._sel.unregister(conn.sock)  # a worker owns it until it hands it back
                    self._pool.submit(self._handle, conn)
            self._sweep(time.monotonic())
        self._close_all()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # closed by stop(), or out of descriptors: the next select retries
            if len(self._conns) >= self.max_connections:
                self._count("conns_refused_full")
                sock.close()
                continue
            sock.setblocking(True)
            sock.settimeout(self.read_timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock, secrets.token_bytes(NONCE_BYTES), time.monotonic() + self.auth_timeout_s)
            try:
                sock.sendall(HELLO + conn.nonce)  # 36 bytes into an empty send buffer: never blocks
            except OSError:
                sock.close()
                continue
            self._count("conns_accepted")
            self._conns[sock.fileno()] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while True:
            try:
                conn, keep = self._returned.get_nowait()
            except queue.Empty:
                return
            if keep and not self._stopped.is_set():
                conn.deadline = time.monotonic() + self.idle_timeout_s
                self._sel.register(conn.sock, selectors.EVENT_READ, conn)
            else:
                self._drop(conn)

    def _sweep(self, now: float) -> None:
        for conn in [c for c in self._conns.values() if c.deadline < now]:
            try:
                self._sel.get_key(conn.sock)
            except (KeyError, ValueError):
                continue  # a worker holds it
            self._sel.unregister(conn.sock)
            self._count("timeouts")
            self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        self._conns.pop(conn.sock.fileno(), None)
        conn.sock.close()

    def _give_back(self, conn: _Conn, keep: bool) -> None:
        self._returned.put((conn, keep))
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass  # stopped

    # -- a worker's turn with one connection ---------------------------------------------------------

    def _handle(self, conn: _Conn) -> None:
        keep = False
        try:
            keep = self._answer(conn)
        except TimeoutError:
            self._count("timeouts")
        except codec.CodecError as exc:
            self._count("bad_frames")
            log.debug("coordl: peer server: bad frame: %s", exc)
        except OSError:
            pass  # the client went away
        except Exception:  # a bug must not take a worker down: drop the connection and go on
            log.exception("coordl: peer server: unexpected error answering a request")
        self._give_back(conn, keep)

    def _authenticate(self, conn: _Conn) -> None:
        """Take what has arrived of the handshake answer, in the loop thread (64 bytes: never a worker's
        time, so connections that trickle bytes or say nothing cannot tie up the pool)."""
        need = NONCE_BYTES + MAC_BYTES - len(conn.answer)
        try:
            data = conn.sock.recv(need)  # readable: returns at once with what is there
        except OSError:
            data = b""
        if not data:
            self._unregister_drop(conn)
            return
        conn.answer += data
        if len(conn.answer) < NONCE_BYTES + MAC_BYTES:
            return
        client_nonce, mac = bytes(conn.answer[:NONCE_BYTES]), bytes(conn.answer[NONCE_BYTES:])
        if not hmac.compare_digest(mac, client_mac(self.secret, conn.nonce, client_nonce)):
            self._count("auth_failures")
            self._unregister_drop(conn)
            return
        try:
            conn.sock.sendall(server_mac(self.secret, conn.nonce, client_nonce))  # 32 bytes: never blocks
        except OSError:
            self._unregister_drop(conn)
            return
        conn.authed = True
        conn.deadline = time.monotonic() + self.idle_timeout_s

    def _unregister_drop(self, conn: _Conn) -> None:
        self._sel.unregister(conn.sock)
        self._drop(conn)

    def _answer(self, conn: _Conn) -> bool:
        """Read one request and answer it; False closes the connection."""
        sock = conn.sock
        frame = recv_frame(sock, self.max_request_bytes)
        kind = codec.read_prefix(frame).kind
        try:
            tree = codec.decode(frame, P.FRAME_KEY, max_payload=self.max_request_bytes)
        except codec.CodecError as exc:
            if kind == P.OP_PUT and "payload crc" in str(exc):
                self._count("puts_refused_checksum")  # framing intact: refuse and keep the connection
                return self._reply(sock, P.ST_ERR, {"error": f"PUT refused: {exc}"})
            raise
        if kind == P.OP_GET:
            return self._get(sock, tree)
        if kind == P.OP_PUT:
            return self._put(sock, tree)
        if kind == P.OP_PING and tree is None:
            return self._reply(sock, P.ST_OK, None)
        self._count("bad_frames")
        self._reply(sock, P.ST_ERR, {"error": f"unknown request kind {kind}"})
        return False

    def _get(self, sock: socket.socket, tree: Any) -> bool:
        idx = tree.get("i") if isinstance(tree, dict) else None
        if not (isinstance(idx, np.ndarray) and idx.ndim == 1 and idx.dtype.kind in "iu"):
            self._count("bad_frames")
            return self._reply(sock, P.ST_ERR, {"error": "GET needs {'i': 1-d integer array}"})
        if len(idx) > P.MAX_GET_ITEMS:
            return self._reply(
                sock, P.ST_ERR, {"error": f"GET of {len(idx)} items exceeds {P.MAX_GET_ITEMS}"}
            )
        n = self.cache.num_items
        hit: list[int] = []
        items: list[Any] = []
        more: list[int] = []
        size = 0
        for i in idx.tolist():
            raw = self.cache.get(i) if 0 <= i < n else None
            if raw is None:
                continue
            if items and size + len(raw) > self.reply_budget:
                more.append(i)
                continue
            hit.append(i)
            items.append(raw)
            size += len(raw)
        self._count("get_requests")
        self._count("items_served", len(hit))
        reply = {"hit": np.asarray(hit, np.int64), "items": items, "more": np.asarray(more, np.int64)}
        # No payload CRC on the way out: every item in the cache was checked on the way in (a PUT's CRC
        # and length) or read by this node itself; the frame's header is still checksummed.
        send_parts(sock, codec.encode_parts(reply, P.FRAME_KEY, kind=P.ST_OK, checksum=False))
        return True

    def _put(self, sock: socket.socket, tree: Any) -> bool:
        index = tree.get("i") if isinstance(tree, dict) else None
        data = tree.get("data") if isinstance(tree, dict) else None
        if type(index) is not int or not isinstance(data, memoryview):
            self._count("bad_frames")
            return self._reply(sock, P.ST_ERR, {"error": "PUT needs {'i': int, 'data': bytes}"})
        if not (0 <= index < self.cache.num_items and self.owns(index)):
            self._count("puts_refused_not_owner")
            return self._reply(sock, P.ST_ERR, {"error": f"PUT refused: item {index} is not this node's"})
        expect = self.item_size(index) if self.item_size is not None else None
        if (expect is not None and len(data) != expect) or len(data) > self.max_item_bytes:
            self._count("puts_refused_length")
            want = f"{expect}" if expect is not None else f"at most {self.max_item_bytes}"
            return self._reply(
                sock, P.ST_ERR, {"error": f"PUT refused: item {index} is {want} bytes, got {len(data)}"}
            )
        stored = bool(self.cache.put(index, data))
        if stored:
            self._count("puts_stored")
        return self._reply(sock, P.ST_OK, {"stored": stored})

    @staticmethod
    def _reply(sock: socket.socket, status: int, tree: Any) -> bool:
        sock.sendall(codec.encode(tree, P.FRAME_KEY, kind=status))
        return True

    # -- lifecycle -----------------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """The server's counters (:data:`~coordl.partitioned.protocol.SERVER_COUNTERS`)."""
        with self._count_lock:
            return dict(self.counts)

    def _close_all(self) -> None:
        for conn in list(self._conns.values()):
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.sock.close()
        self._conns.clear()
        self._sel.close()

    def stop(self) -> None:
        """Stop listening and drop every connection (peers then fall back to storage). Idempotent.

        ``shutdown`` (not only ``close``) because forked DataLoader workers hold copies of the
        descriptors: shutting the socket down ends it for every copy.
        """
        if os.getpid() != self._owner_pid or self._stopped.is_set():
            return
        self._stopped.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._wake_w.send(b"\0")
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=True, cancel_futures=True)
        while not self._returned.empty():  # connections a worker finished with after the loop ended
            self._returned.get_nowait()[0].sock.close()
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self) -> PeerServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __getstate__(self) -> dict:
        raise TypeError("PeerServer runs in the process that created it and cannot be pickled")

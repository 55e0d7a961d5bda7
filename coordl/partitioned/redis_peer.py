"""The partitioned cache's cross-node path: every node's Redis, read one pipelined MGET per owner per batch.

Each node has one ``redis-server`` holding the items it owns (started by the node leader as
``memcache serve`` starts one, or the node's own ``memcache serve`` shared with the sample cache: see
:mod:`coordl.partitioned.tier`). A worker asks every owner of a batch's items at once: one ``MGET`` per
owner (per :data:`MGET_KEYS` keys), all sent before any reply is read, so a batch costs one round trip
in all. Items read from storage are pushed to their owner with ``SET key value NX`` (a pipeline per
owner when several are pending).

What makes this fast (measured in ``benchmarks/bench_peer_transport.py``): one raw
:class:`redis.connection.Connection` per node and per thread, held for the process's life (no pool, no
retry wrapper per call; a forked child opens its own, never its parent's sockets); hiredis parses the
replies, read in redis-py's 32 KiB socket reads (1-4 MiB reads measured 2x slower: fresh large buffers
fault pages in); values are used as the ``bytes`` hiredis built, through a view (no copy of the item).

What makes it safe: values are never unpickled. A value is a :mod:`shmem.codec` frame written under
the item's key, whose header (CRC-checked) carries the key's tag and the payload length, and the item
must have the dataset's length for it: a value stored under another key, truncated, or of another
length is refused (counted, never served). The payload has no CRC (``FLAG_NO_PAYLOAD_CRC``), as on the
path it replaces: Redis stores a ``SET`` whole or not at all (a writer killed mid-command leaves
nothing), TCP checksums both legs, and a CRC is no MAC: whoever holds the password could write a
matching one. The CRC cost ~20 us per 100 KiB item on the 2-core VM, a fifth of the client's CPU.

Errors: a node that cannot be reached, times out or refuses the password is skipped for ``backoff_s``
in this process (its items come from storage) with one warning per node per process; a full node
(``maxmemory`` with ``noeviction``) refuses pushes with an OOM error and is then sent no more pushes:
its missing items stay "not cached", never evicted, never partial.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.connection import Connection, SSLConnection
from redis.retry import Retry

from memcache.tls import TLS
from shmem import codec

__all__ = ["RedisPeerClient", "PEER_COUNTERS", "key_prefix", "encode_item", "MGET_KEYS"]

log = logging.getLogger("coordl")
_NODE_ERRORS = (redis.RedisError, OSError)
CONNECT_TIMEOUT_S = 3.0  # a LAN connect takes < 1 ms: a cut-off node costs this, not the read timeout
MGET_KEYS = 256  # keys per MGET: bounds one reply's size (256 x 1 MiB items = 256 MiB at most)

PEER_COUNTERS = (
    "remote_hits",
    "remote_misses",
    "remote_bytes",
    "remote_errors",
    "remote_pushes",
    "remote_skipped_down",
    "remote_requests",
)


def key_prefix(identity: str) -> str:
    """The keys' prefix for the items of the dataset named ``identity``: ``cdl1:<16 hex digits>:``.

    Apart from the sample cache's ``mc1:`` keys, so one Redis per node can hold both caches.
    """
    return f"cdl1:{hashlib.blake2b(identity.encode(), digest_size=8).hexdigest()}:"


def encode_item(key: str, raw: bytes | memoryview) -> bytes:
    """The value stored under ``key``: a codec frame (header CRC-checked, no payload CRC) of the item."""
    return b"".join(codec.encode_parts({"data": raw}, key, checksum=False))  # one copy: join takes views


class RedisPeerClient:
    """Reads and pushes items in the nodes' Redis servers; safe to copy into DataLoader workers.

    Args:
        addresses: ``(host, port)`` of each node's redis-server, indexed by node (None: none).
        password: the servers' ``requirepass`` (None: no AUTH).
        prefix: the keys' prefix (:func:`key_prefix`); item ``i`` is ``prefix + str(i)``.
        counters: optional SharedCounters holding :data:`PEER_COUNTERS`.
        item_size: the dataset's byte length of item ``i``: a value of another length is refused.
        timeout_s: socket read timeout (connect: at most :data:`CONNECT_TIMEOUT_S`): a frozen node costs
            one such wait, then ``backoff_s``.
        backoff_s: after an error a node is not asked again for this long (per process).
        tls: connect over TLS with these files (:mod:`coordl.partitioned.peer_tls`): the server's
            certificate must chain to ``tls.ca`` and name the node's address; None: plain text.
    """

    def __init__(
        self,
        addresses: Sequence[tuple[str, int] | None],
        *,
        password: str | None,
        prefix: str,
        counters: Any = None,
        item_size: Callable[[int], int] | None = None,
        timeout_s: float = 10.0,
        backoff_s: float = 30.0,
        tls: TLS | None = None,
    ) -> None:
        self.tls = tls
        self.addresses = [tuple(a) if a is not None else None for a in addresses]
        self.password = password
        self.prefix = prefix
        self.counters = counters
        self.item_size = item_size
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._local = threading.local()  # one connection per node and thread: never shared mid-reply
        self._down_until: dict[int, float] = {}
        self._warned: set[int] = set()
        self._full: set[int] = set()
        self._refused: set[int] = set()  # items whose value a read refused: the next push overwrites it

    def _check_pid(self) -> None:
        if self._pid != os.getpid():
            self._reset()  # a forked child must not use its parent's sockets: the replies would interleave

    def key(self, index: int) -> str:
        return f"{self.prefix}{index}"

    def _count(self, amounts: dict[str, int]) -> None:
        if self.counters is not None:
            self.counters.add_many({k: v for k, v in amounts.items() if v})

    def _conns(self) -> dict[int, Connection]:
        conns = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        return conns

    def _conn(self, node: int) -> Connection | None:
        addr = self.addresses[node] if 0 <= node < len(self.addresses) else None
        if addr is None:
            return None
        conns = self._conns()
        c = conns.get(node)
        if c is None:
            kind, extra = (
                (Connection, {}) if self.tls is None else (SSLConnection, self.tls.connection_kwargs())
            )
            c = kind(
                host=addr[0], port=addr[1], password=self.password, socket_timeout=self.timeout_s,
                socket_connect_timeout=min(CONNECT_TIMEOUT_S, self.timeout_s), retry=Retry(NoBackoff(), 0),
                **extra,
            )  # fmt: skip
            conns[node] = c
        return c

    def is_down(self, node: int) -> bool:
        self._check_pid()
        return time.monotonic() < self._down_until.get(node, 0.0)

    def _failed(self, node: int, exc: BaseException) -> None:
        """Skip ``node`` for ``backoff_s``; one warning per node per process (the counters keep counting)."""
        if not self.is_down(node):
            self._count({"remote_errors": 1})
        self._down_until[node] = time.monotonic() + self.backoff_s
        c = self._conns().pop(node, None)
        if c is not None:
            c.disconnect()  # its reply stream is broken: the next request opens a fresh connection
        if node in self._warned:
            return
        self._warned.add(node)
        host, port = self.addresses[node] or ("?", 0)
        if isinstance(exc, redis.AuthenticationError) or "NOAUTH" in str(exc) or "WRONGPASS" in str(exc):
            log.error(
                "coordl: the Redis of node %d at %s:%d refused the password (%s): every node's Redis must "
                "use the same one (the job's secret, or MEMCACHE_PASSWORD for a shared 'memcache serve'); "
                "its items come from storage",
                node, host, port, exc,
            )  # fmt: skip
            return
        log.warning(
            "coordl: the Redis of node %d at %s:%d failed (%s: %s); its items come from storage for the "
            "next %.0f s",
            node, host, port, type(exc).__name__, exc, self.backoff_s,
        )  # fmt: skip

    def fetch(self, wanted: Mapping[int, Iterable[int]]) -> dict[int, memoryview]:
        """The items each node has of those asked: MGETs to every node sent first, then every reply read.

        Misses, refused values, errors and down nodes are simply absent (the caller reads storage).
        """
        self._check_pid()
        sent: list[tuple[int, Connection, list[int]]] = []
        failed: set[int] = set()
        skipped = 0
        for node, indices in wanted.items():
            idx = sorted(set(indices))
            if not idx:
                continue
            if self.is_down(node):
                skipped += 1
                continue
            conn = self._conn(node)
            if conn is None:
                continue
            try:
                for start in range(0, len(idx), MGET_KEYS):
                    chunk = idx[start : start + MGET_KEYS]
                    conn.send_command("MGET", *[f"{self.prefix}{i}" for i in chunk])
                    sent.append((node, conn, chunk))
            except _NODE_ERRORS as exc:
                failed.add(node)
                self._failed(node, exc)
        out: dict[int, memoryview] = {}
        tally = {"remote_requests": 0, "remote_hits": 0, "remote_misses": 0, "remote_bytes": 0}
        tally["remote_skipped_down"] = skipped
        for node, conn, chunk in sent:
            if node in failed:
                continue
            try:
                values = conn.read_response()
            except _NODE_ERRORS as exc:
                failed.add(node)
                self._failed(node, exc)
                continue
            tally["remote_requests"] += 1
            for i, value in zip(chunk, values, strict=True):
                self._take(out, i, value, tally)
        self._count(tally)
        return out

    def _take(self, out: dict[int, memoryview], index: int, value: bytes | None, tally: dict) -> None:
        if value is None:
            tally["remote_misses"] += 1
            return
        try:
            tree = codec.decode(value, self.key(index), verify_payload=False)
            raw = tree["data"] if isinstance(tree, dict) else None
            if not isinstance(raw, memoryview):
                raise codec.CodecError("the value holds no item bytes")
            if self.item_size is not None and len(raw) != self.item_size(index):
                raise codec.CodecError(f"item {index} is {self.item_size(index)} bytes, the value {len(raw)}")
        except (codec.CodecError, KeyError, TypeError) as exc:
            tally["remote_misses"] += 1
            tally["remote_errors"] = tally.get("remote_errors", 0) + 1
            self._refused.add(index)
            log.debug("coordl: refused the Redis value of item %d: %s", index, exc)
            return
        out[index] = raw
        tally["remote_hits"] += 1
        tally["remote_bytes"] += len(raw)

    def get(self, node: int, index: int) -> memoryview | None:
        return self.fetch({node: [index]}).get(index)

    def put(self, node: int, index: int, raw: bytes | memoryview) -> bool:
        """``SET NX`` one item in node ``node``'s Redis (see :meth:`put_many`)."""
        return self.put_many(node, [(index, raw)]) == 1

    def put_many(self, node: int, items: Sequence[tuple[int, bytes | memoryview]]) -> int:
        """``SET NX`` items in node ``node``'s Redis, pipelined; how many were stored. Never raises.

        Nothing is sent to a node that is down or full; a full node's OOM refusal marks it full.
        """
        self._check_pid()
        if not items or node in self._full or self.is_down(node):
            return 0
        conn = self._conn(node)
        if conn is None:
            return 0
        try:
            # NX, except over a value this process refused: SET NX alone would keep it forever (the
            # item read from storage every epoch, an error counted each time).
            cmds = [("SET", self.key(i), encode_item(self.key(i), raw), *(() if i in self._refused else ("NX",)))
                    for i, raw in items]  # fmt: skip
            self._refused.difference_update(i for i, _ in items)
            conn.send_packed_command(conn.pack_commands(cmds))
            replies = []
            for _ in cmds:
                try:
                    replies.append(conn.read_response())
                except redis.ResponseError as exc:  # this command refused; the stream is intact
                    replies.append(exc)
        except _NODE_ERRORS as exc:
            self._failed(node, exc)
            return 0
        stored = sum(1 for r in replies if r is True or r == b"OK")
        refused = [r for r in replies if isinstance(r, redis.ResponseError)]
        full = [r for r in refused if isinstance(r, redis.exceptions.OutOfMemoryError)]
        if full and node not in self._full:
            self._full.add(node)  # noeviction: full for good; its missing items stay "not cached"
            log.info("coordl: the Redis of node %d is full (maxmemory); no more pushes to it", node)
        if len(full) < len(refused):
            self._failed(node, next(r for r in refused if r not in full))  # e.g. NOAUTH: unusable, not full
        self._count({"remote_pushes": stored})
        return stored

    def ping(self, node: int) -> bool:
        self._check_pid()
        conn = self._conn(node)
        try:
            if conn is None:
                return False
            conn.send_command("PING")
            return conn.read_response() in (b"PONG", "PONG", True)
        except _NODE_ERRORS:
            return False

    def close(self) -> None:
        """Close this thread's connections in this process (the servers keep the items)."""
        self._check_pid()
        conns = self._conns()
        for c in conns.values():
            c.disconnect()
        conns.clear()

    def __getstate__(self) -> dict:
        keep = ("addresses", "password", "prefix", "counters", "item_size", "timeout_s", "backoff_s", "tls")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

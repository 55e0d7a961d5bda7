"""The partitioned cache's cross-node path on Redis: the option measured against the home-made server.

Each node leader runs its own ``redis-server`` (started as ``memcache serve`` does it:
:func:`memcache.server.start_redis`, bound to the node's advertised address, ``requirepass`` = the job's
secret, ``noeviction``) holding the items it owns; peers read a batch's items from each owner with one
``MGET`` and push with ``SET NX``. Values are :mod:`shmem.codec` frames written under the item's key,
so a value stored under another key, truncated or corrupted is refused when read (counted, never served).

What this path cannot do that :class:`coordl.partitioned.server.PeerServer` does (see
``docs/distributed.md``): Redis ``AUTH`` sends the password in clear text on every new connection (no
challenge-response: an eavesdropper can replay it), and Redis stores whatever an authenticated client
SETs, so wrong-owner or wrong-length pushes are caught only when read, not refused when written.

:class:`RedisPeerClient` has :class:`coordl.partitioned.peer.PeerClient`'s interface (``fetch``, ``get``,
``put``, ``is_down``, ``close``), so :class:`coordl.partitioned.tier.PartitionedTier` runs on either.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from shmem import codec

__all__ = ["RedisPeerClient", "item_key", "encode_item"]

log = logging.getLogger("coordl")
_NODE_ERRORS = (redis.RedisError, OSError)
MGET_KEYS = 256  # keys per MGET: bounds one reply's size


def item_key(index: int) -> str:
    return f"cdl:i:{index}"


def encode_item(index: int, raw: bytes | memoryview) -> bytes:
    """The value stored for item ``index``: a codec frame keyed by the item's key."""
    return codec.encode({"data": raw}, item_key(index))


class RedisPeerClient:
    """Reads and pushes items in the owners' Redis servers; safe to copy into DataLoader workers.

    Args:
        addresses: ``(host, port)`` of each node's redis-server, indexed by node (None: none).
        secret: the job's secret; its hex form is the servers' ``requirepass``.
        counters: optional SharedCounters holding :data:`coordl.partitioned.protocol.PEER_COUNTERS`.
        item_size: the dataset's byte length of item ``i``: a value of another length is refused.
        timeout_s: socket connect/read timeout.
        backoff_s: after an error a node is not asked again for this long (per process).
    """

    def __init__(
        self,
        addresses: Sequence[tuple[str, int] | None],
        *,
        secret: bytes,
        counters: Any = None,
        item_size: Callable[[int], int] | None = None,
        timeout_s: float = 10.0,
        backoff_s: float = 30.0,
    ) -> None:
        self.addresses = [tuple(a) if a is not None else None for a in addresses]
        self.secret = bytes(secret)
        self.counters = counters
        self.item_size = item_size
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._clients: dict[int, redis.Redis] = {}
        self._down_until: dict[int, float] = {}

    def _check_pid(self) -> None:
        if self._pid != os.getpid():
            self._reset()  # never share a parent's sockets

    def _count(self, amounts: dict[str, int]) -> None:
        if self.counters is not None:
            self.counters.add_many({k: v for k, v in amounts.items() if v})

    def _client(self, node: int) -> redis.Redis | None:
        addr = self.addresses[node] if 0 <= node < len(self.addresses) else None
        if addr is None:
            return None
        c = self._clients.get(node)
        if c is None:
            c = redis.Redis(
                host=addr[0], port=addr[1], password=self.secret.hex(), socket_timeout=self.timeout_s,
                socket_connect_timeout=self.timeout_s, retry=Retry(NoBackoff(), 0),
            )  # fmt: skip
            self._clients[node] = c
        return c

    def is_down(self, node: int) -> bool:
        self._check_pid()
        return time.monotonic() < self._down_until.get(node, 0.0)

    def _failed(self, node: int, exc: BaseException) -> None:
        self._down_until[node] = time.monotonic() + self.backoff_s
        self._count({"remote_errors": 1})
        log.warning("coordl: redis peer node %d failed (%s: %s)", node, type(exc).__name__, exc)
        c = self._clients.pop(node, None)
        if c is not None:
            c.close()

    def fetch(self, wanted: dict[int, Iterable[int]]) -> dict[int, memoryview]:
        """The items each node has of those asked (one MGET per node and per :data:`MGET_KEYS`)."""
        self._check_pid()
        out: dict[int, memoryview] = {}
        for node, indices in wanted.items():
            idx = sorted(set(indices))
            if not idx:
                continue
            if self.is_down(node):
                self._count({"remote_skipped_down": 1})
                continue
            client = self._client(node)
            if client is None:
                continue
            try:
                for start in range(0, len(idx), MGET_KEYS):
                    chunk = idx[start : start + MGET_KEYS]
                    values = client.mget([item_key(i) for i in chunk])
                    self._count({"remote_requests": 1})
                    for i, value in zip(chunk, values, strict=True):
                        self._take(out, i, value)
            except _NODE_ERRORS as exc:
                self._failed(node, exc)
        return out

    def _take(self, out: dict[int, memoryview], index: int, value: bytes | None) -> None:
        if value is None:
            self._count({"remote_misses": 1})
            return
        try:
            tree = codec.decode(value, item_key(index))
            raw = tree["data"]
            if not isinstance(raw, memoryview):
                raise codec.CodecError("value holds no item bytes")
            if self.item_size is not None and len(raw) != self.item_size(index):
                raise codec.CodecError(f"item {index} is {self.item_size(index)} bytes, the value {len(raw)}")
        except (codec.CodecError, KeyError, TypeError) as exc:
            self._count({"remote_errors": 1, "remote_misses": 1})
            log.debug("coordl: refused redis value of item %d: %s", index, exc)
            return
        out[index] = raw
        self._count({"remote_hits": 1, "remote_bytes": len(raw)})

    def get(self, node: int, index: int) -> memoryview | None:
        return self.fetch({node: [index]}).get(index)

    def put(self, node: int, index: int, raw: bytes | memoryview) -> bool:
        """SET NX the item in node ``node``'s server. False on error, when present, or when it is down."""
        self._check_pid()
        if self.is_down(node):
            return False
        client = self._client(node)
        if client is None:
            return False
        try:
            stored = bool(client.set(item_key(index), encode_item(index, raw), nx=True))
        except redis.ResponseError as exc:  # e.g. OOM under noeviction: the node is full, not down
            log.debug("coordl: redis peer node %d refused item %d: %s", node, index, exc)
            return False
        except _NODE_ERRORS as exc:
            self._failed(node, exc)
            return False
        self._count({"remote_pushes": 1})
        return stored

    def ping(self, node: int) -> bool:
        client = self._client(node)
        try:
            return client is not None and bool(client.ping())
        except _NODE_ERRORS:
            return False

    def close(self) -> None:
        self._check_pid()
        for c in self._clients.values():
            c.close()
        self._clients.clear()

    def __getstate__(self) -> dict:
        keep = ("addresses", "secret", "counters", "item_size", "timeout_s", "backoff_s")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

"""RedisStore: the distributed sample cache, one Redis server per node, keys spread by consistent hashing.

Each node's server holds about 1/N of the samples (:class:`memcache.hashring.HashRing`), so the cluster's
aggregate memory caches a dataset no single node could. Reads are one MGET per node per batch, writes
one pipeline of ``SET NX`` per node per batch (never overwrite, except a value a read refused: a plain
``SET`` replaces it). The servers run with ``maxmemory`` and ``noeviction`` (see :mod:`memcache.server`):
when a node is full, Redis refuses the write with an OOM error and this client stops sending puts to
that node.

A node that is unreachable or dies: its keys become misses (the loader fetches and preps them as
usual), one warning is logged per node, the ``errors``/``node_failures`` stats count it, and the node is
retried after ``retry_after_s``. Training never sees an exception from the cache.

Over TLS (``tls=``, a ``rediss://`` node, or ``MEMCACHE_TLS_*`` set; see :mod:`memcache.tls`): every
connection verifies the server's certificate against the CA and presents this client's; the password
and the samples then never cross the network in clear.

Picklable for DataLoader workers: only the configuration travels; each process opens its own
connections on first use (a socket is never shared across ``fork``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from memcache.codec import CodecError, decode, encode
from memcache.hashring import HashRing
from memcache.tls import TLS, resolve, split_url

__all__ = ["RedisStore"]

log = logging.getLogger(__name__)
# Anything that makes a whole node unusable: unreachable, timed out, wrong or missing password.
_NODE_ERRORS = (redis.RedisError, OSError)


def _parse_node(node: str) -> tuple[str, int]:
    host, sep, port = node.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"RedisStore node must be 'host:port', got {node!r}")
    return host.strip("[]"), int(port)


class RedisStore:
    """Sample cache spread over one Redis server per node.

    Args:
        nodes: ``["host:port", ...]``, the same list (any order) in every process of the job;
            ``rediss://host:port`` asks for TLS (all nodes alike).
        password: the servers' ``requirepass`` (default: ``$MEMCACHE_PASSWORD`` when set).
        tls: a :class:`memcache.TLS` (CA, this client's certificate and key), True (the files in
            ``MEMCACHE_TLS_CA``/``_CERT``/``_KEY``), False (plain text), or None: TLS when those
            variables are set or the nodes say ``rediss://``.
        timeout_s: socket connect/read timeout; a node slower than this counts as down.
        retry_after_s: how long a failed node is skipped before it is tried again.
        batch_keys: keys per MGET (bounds the size of one reply).
    """

    def __init__(
        self,
        nodes: Sequence[str],
        password: str | None = None,
        *,
        timeout_s: float = 2.0,
        retry_after_s: float = 30.0,
        batch_keys: int = 256,
        tls: TLS | bool | None = None,
    ) -> None:
        split = [split_url(str(n)) for n in nodes]
        schemes = {said for _, said in split}
        if len(schemes) > 1:
            raise ValueError(f"RedisStore nodes mix redis://, rediss:// and bare addresses: {list(nodes)}")
        self.nodes = [n for n, _ in split]
        for n in self.nodes:
            _parse_node(n)
        self.tls = resolve(tls, schemes.pop() if schemes else None, "RedisStore")
        self.password = password if password is not None else os.environ.get("MEMCACHE_PASSWORD") or None
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s
        self.batch_keys = batch_keys
        self._ring = HashRing(self.nodes)
        self._pid = -1

    def _ensure(self) -> None:
        if self._pid == os.getpid():
            return
        # New process (or first use): fresh connections, fresh per-process stats.
        self._clients: dict[str, redis.Redis] = {}
        self._down_until: dict[str, float] = {}
        self._warned: set[str] = set()
        self._full: set[str] = set()
        self._refused: set[str] = set()  # keys whose stored value was refused: the next put overwrites it
        self._stats = dict.fromkeys(
            ("hits", "misses", "errors", "node_failures", "puts", "put_bytes", "put_rejected"), 0
        )
        self._pid = os.getpid()

    def _client(self, node: str) -> redis.Redis:
        c = self._clients.get(node)
        if c is None:
            host, port = _parse_node(node)
            c = redis.Redis(
                host=host,
                port=port,
                password=self.password,
                socket_timeout=self.timeout_s,
                socket_connect_timeout=self.timeout_s,
                # No client-side retries with backoff: a cache miss is cheaper than waiting; the node
                # is skipped for retry_after_s instead.
                retry=Retry(NoBackoff(), 0),
                **(self.tls.client_kwargs() if self.tls is not None else {}),
            )
            self._clients[node] = c
        return c

    def _available(self, node: str) -> bool:
        until = self._down_until.get(node)
        if until is None:
            return True
        if time.monotonic() >= until:
            del self._down_until[node]  # try it again
            return True
        return False

    def _node_failed(self, node: str, error: BaseException) -> None:
        self._stats["errors"] += 1
        self._stats["node_failures"] += 1
        self._down_until[node] = time.monotonic() + self.retry_after_s
        if node not in self._warned:
            self._warned.add(node)
            log.warning(
                "memcache: Redis node %s failed (%s: %s); its keys are misses, served by the normal "
                "fetch+prep path; retrying it every %.0f s",
                node,
                type(error).__name__,
                error,
                self.retry_after_s,
            )
        c = self._clients.pop(node, None)
        if c is not None:
            c.close()

    def get_many(self, keys: Iterable[str]) -> dict[str, np.ndarray]:
        """Arrays of the keys present on reachable nodes; misses, down nodes and bad values are left out."""
        self._ensure()
        out: dict[str, np.ndarray] = {}
        for node, node_keys in self._ring.split(list(keys)).items():
            if not self._available(node):
                self._stats["misses"] += len(node_keys)
                continue
            done = 0
            try:
                client = self._client(node)
                for start in range(0, len(node_keys), self.batch_keys):
                    chunk = node_keys[start : start + self.batch_keys]
                    values = client.mget(chunk)
                    for key, value in zip(chunk, values, strict=True):
                        self._decode_into(out, key, value)
                    done += len(chunk)
            except _NODE_ERRORS as e:
                self._node_failed(node, e)
                self._stats["misses"] += len(node_keys) - done
        return out

    def _decode_into(self, out: dict, key: str, value: bytes | str | None) -> None:
        # (redis-py types replies as str too, for clients made with decode_responses: never ours.)
        if value is None:
            self._stats["misses"] += 1
            return
        try:
            out[key] = decode(key, value)
            self._stats["hits"] += 1
        except CodecError as e:
            # A stale or foreign value: never served. Counted, logged at debug level (can be many).
            self._stats["errors"] += 1
            self._stats["misses"] += 1
            self._refused.add(key)
            log.debug("memcache: refused value of %s: %s", key, e)

    def put_many(self, items: Mapping[str, np.ndarray]) -> int:
        """Store values not yet present (``SET NX``); returns how many were stored. Never raises."""
        self._ensure()
        stored = 0
        for node, node_keys in self._ring.split(list(items)).items():
            if node in self._full or not self._available(node):
                self._stats["put_rejected"] += len(node_keys)
                continue
            try:
                pipe = self._client(node).pipeline(transaction=False)
                sizes = []
                for key in node_keys:
                    value = encode(key, items[key])
                    sizes.append(len(value))
                    # NX, except over a value this process refused (corrupt, another key's): SET NX alone
                    # would keep that value forever, a miss and an error in every epoch.
                    pipe.set(key, value, nx=key not in self._refused)
                    self._refused.discard(key)
                results = pipe.execute(raise_on_error=False)
            except _NODE_ERRORS as e:
                self._node_failed(node, e)
                self._stats["put_rejected"] += len(node_keys)
                continue
            for size, result in zip(sizes, results, strict=True):
                if isinstance(result, redis.exceptions.OutOfMemoryError):
                    if node not in self._full:
                        self._full.add(node)  # noeviction refused it: the node is full, stop sending
                        log.info("memcache: Redis node %s is full (maxmemory); no more puts to it", node)
                    self._stats["put_rejected"] += 1
                elif isinstance(result, Exception):
                    self._stats["errors"] += 1
                    self._stats["put_rejected"] += 1
                elif result:
                    stored += 1
                    self._stats["put_bytes"] += size
        self._stats["puts"] += stored
        return stored

    def stats(self) -> dict[str, int]:
        """This process's counts, plus how many nodes are currently skipped as down or full."""
        self._ensure()
        now = time.monotonic()
        down = sum(1 for t in self._down_until.values() if t > now)
        return {**self._stats, "nodes": len(self.nodes), "nodes_down": down, "nodes_full": len(self._full)}

    def close(self) -> None:
        """Close this process's connections (the servers keep the data)."""
        if self._pid != os.getpid():
            return
        for c in self._clients.values():
            c.close()
        self._clients.clear()

    def __getstate__(self) -> dict:
        keep = ("nodes", "password", "timeout_s", "retry_after_s", "batch_keys")
        return {**{k: getattr(self, k) for k in keep}, "tls": self.tls or False}

    def __setstate__(self, state: dict) -> None:
        nodes = state.pop("nodes")
        password = state.pop("password")
        type(self).__init__(self, nodes, password, **state)

    def __repr__(self) -> str:
        tls = ", tls=True" if self.tls is not None else ""
        return f"RedisStore(nodes={self.nodes!r}, password={'***' if self.password else None}{tls})"

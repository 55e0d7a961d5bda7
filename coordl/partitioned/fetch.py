"""The partitioned cache's fetch tier: the node's own share from its MinIO cache, the rest from the owners.

CoorDL's partitioned caching (Mohan et al., VLDB 2021): on N nodes each node's MinIO cache holds a
disjoint share of the items, so the job's aggregate memory caches a dataset no single node can. A fetch
asks the owner: the local cache when this node owns the item, else the owner's Redis
(:mod:`coordl.partitioned.redis_peer`, one pipelined request per owner per batch); storage is
read only for items nobody has yet. An item read from storage is pushed to its owner (in the
background), so after one epoch the aggregate cache holds the whole dataset and storage is not read
again: the loader ends each epoch with :meth:`PartitionedTier.end_epoch`, which waits (bounded) until
the pushes of its processes have reached their owners. A peer that dies or is cut off is skipped for a
backoff period and its items come from storage.

Set-up (each node's Redis, the address and secret exchange) is :mod:`coordl.partitioned.tier`.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from multiprocessing import util as mp_util
from typing import Any, Protocol

from coordl.partitioned.options import PUSH_WAIT_S
from coordl.partitioned.ownership import OwnerMap
from coordl.partitioned.redis_peer import PEER_COUNTERS
from shmem.counters import SharedCounters

__all__ = ["PartitionedTier", "Transport", "PUSH_COUNTERS"]

log = logging.getLogger("coordl")

_PUSH_QUEUE_ITEMS = 256  # pending pushes per process; beyond this a push is dropped (storage still has it)
_PUSH_FLUSH_S = 10.0  # how long an exiting worker waits for its pending pushes
_PUSH_BATCH = 64  # pushes sent in one pipelined round trip per owner
# Per process, in shared memory: pushes queued and ended (sent, refused, skipped or dropped), so that the
# loader's process sees what its workers still have in flight; then what stats() shows of the pushes.
PUSH_COUNTERS = (
    "push_queued",
    "push_ended",
    "remote_push_dropped",
    "remote_push_late",
    "remote_push_wait_ms",
)


class Transport(Protocol):
    """What the tier needs of a client of the owners' caches (:class:`RedisPeerClient`, or a test's)."""

    counters: Any

    def fetch(self, wanted: Mapping[int, Sequence[int]]) -> dict[int, memoryview]: ...
    def put(self, node: int, index: int, raw: bytes | memoryview) -> bool: ...
    def put_many(self, node: int, items: Sequence[tuple[int, bytes | memoryview]]) -> int: ...
    def is_down(self, node: int) -> bool: ...
    def close(self) -> None: ...


class PartitionedTier:
    """A fetch tier (``get``/``offer``/``stats``) over the node's MinIO cache and the nodes' Redis.

    Args:
        owners: the job's :class:`OwnerMap`.
        node: this process's node index.
        client: a :class:`Transport` with every node's Redis address (own node included).
        mirror_local: also push owned items to this node's own Redis (which peers read; it does not
            see the MinIO cache), and ask it for owned items the MinIO cache lacks (then kept there).
        counters: the loader's base counters (``cache_hits``/``cache_misses``).
        local_cache: the node's MinioCache on the node leader; None on the node's other ranks, which
            reach their node's share through its Redis.
        push: send items read from storage to their owner, so the aggregate cache fills in one epoch.
        peer_counters: SharedCounters holding :data:`PEER_COUNTERS` (made when None).
        server: the node's self-started :class:`memcache.server.RedisServer` on its leader (stopped by
            :meth:`close`), else None.
        push_wait_s: the longest :meth:`end_epoch` waits for pushes in flight.
    """

    name = "partitioned"

    def __init__(
        self,
        owners: OwnerMap,
        node: int,
        client: Transport,
        counters: SharedCounters,
        *,
        local_cache: Any = None,
        push: bool = True,
        peer_counters: SharedCounters | None = None,
        server: Any = None,
        mirror_local: bool = False,
        push_wait_s: float = PUSH_WAIT_S,
    ) -> None:
        self.owners = owners
        self.node = node
        self.client = client
        self.counters = counters
        self.local_cache = local_cache
        self.push = push
        self._own_peer_counters = peer_counters is None  # made here: closed (unlinked) here
        self.peer_counters = peer_counters if peer_counters is not None else SharedCounters(PEER_COUNTERS)
        if client.counters is None:
            client.counters = self.peer_counters
        self.server = server
        self.mirror_local = mirror_local
        self.push_wait_s = push_wait_s
        self._owner_pid = os.getpid()
        self._pushes = SharedCounters(PUSH_COUNTERS)  # this process's and its workers' (closed here)
        self._own_pushes = True
        self._queued_at_end = 0  # pushes queued (all processes, ever) when end_epoch last looked
        self._pusher: _Pusher | None = None
        self._pusher_pid = -1

    def get(self, index: int) -> bytes | memoryview | None:
        return self.get_many([index]).get(index)

    def get_many(self, indices: Sequence[int]) -> dict[int, bytes | memoryview]:
        """The items of ``indices`` that the job's caches hold; the others are absent (read storage).

        Owned items come from the local cache; the rest are asked of their owners with one request per
        owner, all sent before any reply is read: a batch costs one round trip, not one per item.
        """
        out: dict[int, bytes | memoryview] = {}
        remote: dict[int, list[int]] = {}
        local_hits = local_misses = 0
        for index in indices:
            owner = self.owners.owner(index)
            if owner == self.node and self.local_cache is not None:
                raw = self.local_cache.get(index)
                if raw is None and self.mirror_local:
                    remote.setdefault(owner, []).append(index)
                elif raw is None:
                    local_misses += 1
                else:
                    out[index] = raw
                    local_hits += 1
            else:
                remote.setdefault(owner, []).append(index)
        if remote:
            got = self.client.fetch(remote)  # hits counted as remote_hits by the client
            out.update(got)
            local_misses += sum(len(set(v)) for v in remote.values()) - len(got)
            if self.mirror_local and self.local_cache is not None:
                # Owned items a peer pushed into this node's Redis: into the MinIO cache too, so that
                # from the next epoch on they are read from shared memory, not over loopback.
                for index in remote.get(self.node, ()):
                    if index in got:
                        self.local_cache.put(index, got[index])
        self.counters.add_many({"cache_hits": local_hits, "cache_misses": local_misses})
        return out

    def offer(self, index: int, raw: bytes | memoryview) -> None:
        owner = self.owners.owner(index)
        if owner == self.node and self.local_cache is not None:
            self.local_cache.put(index, raw)
            if self.mirror_local and self.push:
                self._get_pusher().submit(owner, index, bytes(raw))
        elif self.push and not self.client.is_down(owner):
            self._get_pusher().submit(owner, index, bytes(raw))

    def _get_pusher(self) -> _Pusher:
        if self._pusher is None or self._pusher_pid != os.getpid():
            self._pusher = _Pusher(self.client, self._pushes)
            self._pusher_pid = os.getpid()
        return self._pusher

    def flush(self, timeout_s: float = _PUSH_FLUSH_S) -> None:
        """Wait (bounded) until this process's pending pushes are sent."""
        if self._pusher is not None and self._pusher_pid == os.getpid():
            self._pusher.flush(timeout_s)

    def end_epoch(self, timeout_s: float | None = None) -> None:
        """Wait until the items this process and its workers read from storage have reached their owners.

        They are pushed in the background while the epoch runs; one still on its way when a node asks its
        owner for it in the next epoch would be read from storage again. Waits for the pushes of the
        processes that run now (one that died never sends its own), at most ``timeout_s`` (default
        ``push_wait_s``): a push to a node that is down ends at once (skipped), one to a frozen node after
        the client's timeout; past the bound it logs a warning, counts the pushes left in
        ``remote_push_late`` (their items are read from storage once more) and returns.
        """
        wait = self.push_wait_s if timeout_s is None else timeout_s
        queued = self._pushes.snapshot()["push_queued"]
        # Nothing queued since the last end: done (the loader ends an epoch at its last batch and again at
        # its StopIteration; what the first left in flight was waited for, and counted, once).
        if not self.push or wait <= 0 or queued == self._queued_at_end:
            return
        self._queued_at_end = queued
        start = time.monotonic()
        pending, pause = self._pending(), 0.001
        while pending > 0 and time.monotonic() - start < wait:
            time.sleep(pause)
            pending, pause = self._pending(), min(pause * 2, 0.05)
        waited = time.monotonic() - start
        self._pushes.add_many(
            {"remote_push_wait_ms": int(waited * 1000), "remote_push_late": max(pending, 0)}
        )
        if pending > 0:
            log.warning(
                "coordl: partitioned cache: %d item(s) read from storage had not reached their owners "
                "%.1f s after the epoch's end (push_wait_s); going on, they will be read from storage again",
                pending, waited,
            )  # fmt: skip

    def _pending(self) -> int:
        live = self._pushes.live_snapshot()
        return live["push_queued"] - live["push_ended"]

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.peer_counters.snapshot())
        out.update((k, v) for k, v in self._pushes.snapshot().items() if k.startswith("remote_"))
        if self.local_cache is not None:
            out.update(self.local_cache.stats())
        out["partition_node"] = self.node
        out["partition_nodes"] = self.owners.num_nodes
        out["partition_owned_items"] = self.owners.counts()[self.node]
        return out

    def close(self) -> None:
        """Flush pushes, stop the node's self-started Redis (leader only) and close connections.

        The local cache belongs to whoever made it (the loader), which closes it.
        """
        self.flush()
        self.client.close()
        if os.getpid() != self._owner_pid:
            return  # a forked copy: the server belongs to the process that made it
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self._own_peer_counters:  # else its /dev/shm segment outlived the loader until the next start
            self._own_peer_counters = False
            self.peer_counters.close()
        if self._own_pushes:
            self._own_pushes = False
            self._pushes.close()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["server"] = None  # the server stays in the process that runs it
        state["_pusher"] = None
        state["_pusher_pid"] = -1
        return state


class _Pusher:
    """One background thread per process that sends items to their owners without stalling the worker.

    Each push is counted in ``counts`` when queued and when it ends (sent, refused, skipped because its
    owner is down, or dropped on a full queue), in this process's row: the difference over the
    processes alive is what :meth:`PartitionedTier.end_epoch` waits for.
    """

    def __init__(self, client: Transport, counts: SharedCounters) -> None:
        self.client = client
        self.counts = counts
        self.q: queue.Queue = queue.Queue(maxsize=_PUSH_QUEUE_ITEMS)
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="coordl-push", daemon=True)
        self._thread.start()
        # DataLoader workers leave through multiprocessing's exit path, which runs Finalize hooks
        # (not atexit): flush there so the last pushes of an epoch are not lost.
        mp_util.Finalize(self, _Pusher.flush, args=(self, _PUSH_FLUSH_S), exitpriority=10)

    def submit(self, node: int, index: int, raw: bytes) -> None:
        self.counts.add("push_queued")  # before the thread can end it: the difference is never < 0
        try:
            self.q.put_nowait((node, index, raw))
        except queue.Full:
            self.dropped += 1  # the owner gets it from storage next time; never block a worker on this
            self.counts.add_many({"push_ended": 1, "remote_push_dropped": 1})

    def _run(self) -> None:
        while True:
            pending = [self.q.get()]
            while len(pending) < _PUSH_BATCH:  # whatever else is queued goes in the same round trip
                try:
                    pending.append(self.q.get_nowait())
                except queue.Empty:
                    break
            try:
                by_node: dict[int, list[tuple[int, bytes]]] = {}
                for node, index, raw in pending:
                    by_node.setdefault(node, []).append((index, raw))
                for node, items in by_node.items():
                    if not self.client.is_down(node):
                        self.client.put_many(node, items)
            except Exception:  # noqa: BLE001 - a transport that raised: log it, keep the thread for the next
                log.exception(
                    "coordl: partitioned cache: pushing %d item(s) to their owners failed", len(pending)
                )
            finally:
                self.counts.add("push_ended", len(pending))
                for _ in pending:
                    self.q.task_done()

    def flush(self, timeout_s: float) -> None:
        done = threading.Event()

        def waiter() -> None:
            self.q.join()
            done.set()

        threading.Thread(target=waiter, daemon=True).start()
        done.wait(timeout_s)

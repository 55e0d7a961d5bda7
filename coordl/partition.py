"""Partitioned MinIO cache across the nodes of a data-parallel job, and its sampler.

CoorDL's partitioned caching (Mohan et al., VLDB 2021): on N nodes each node's MinIO cache holds a
disjoint share of the items, so the job's aggregate memory caches a dataset no single node can. Who
owns item i follows from a shared seed and the nodes' cache budgets (:class:`OwnerMap`): no metadata
service. A fetch asks the owner: the local cache when this node owns the item, else the owner's
:class:`coordl.peer.PeerServer` over TCP; storage is read only for items nobody has yet. An item read
from storage is pushed to its owner (in the background), so after one epoch the aggregate cache holds
the whole dataset and storage is not read again. A peer that dies or is cut off is skipped for a
backoff period and its items come from storage.

:class:`PartitionedSampler` gives each rank a fresh random shard every epoch, with the same number of
samples on every rank (unequal batch counts hang DDP).

This module is the fetch tier and its setup. The owner map, the sampler and :class:`NodeTopology` live in
:mod:`coordl.ownership` and are re-exported here, so ``from coordl.partition import OwnerMap`` still works.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from multiprocessing import util as mp_util
from typing import Any

from coordl.counters import SharedCounters
from coordl.ownership import NodeTopology, OwnerMap, PartitionedSampler
from coordl.peer import PEER_COUNTERS, PeerClient, advertise_address

__all__ = [
    "OwnerMap",
    "PartitionedSampler",
    "PartitionedTier",
    "NodeTopology",
    "PEER_COUNTERS",
    "advertise_address",
    "build_partitioned_tier",
]

log = logging.getLogger("coordl")

_PUSH_QUEUE_ITEMS = 256  # pending pushes per process; beyond this a push is dropped (storage still has it)
_PUSH_FLUSH_S = 10.0  # how long an exiting worker waits for its pending pushes


class PartitionedTier:
    """A fetch tier (``get``/``offer``/``stats``) over the node's MinIO cache and its peers' servers.

    Args:
        owners: the job's :class:`OwnerMap`.
        node: this process's node index.
        client: a :class:`PeerClient` with every node's server address (own node included).
        counters: the loader's base counters (``cache_hits``/``cache_misses``).
        local_cache: the node's MinioCache on the node leader; None on the node's other ranks, which
            reach their node's cache through its server.
        push: send items read from storage to their owner, so the aggregate cache fills in one epoch.
        peer_counters: SharedCounters holding :data:`PEER_COUNTERS` (made when None).
    """

    name = "partitioned"

    def __init__(
        self,
        owners: OwnerMap,
        node: int,
        client: PeerClient,
        counters: SharedCounters,
        *,
        local_cache: Any = None,
        push: bool = True,
        peer_counters: SharedCounters | None = None,
    ) -> None:
        self.owners = owners
        self.node = node
        self.client = client
        self.counters = counters
        self.local_cache = local_cache
        self.push = push
        self.peer_counters = peer_counters if peer_counters is not None else SharedCounters(PEER_COUNTERS)
        if client.counters is None:
            client.counters = self.peer_counters
        self.server: Any = None  # set by build_partitioned_tier on the node leader; stopped by close()
        self.owns_cache = False  # True when build_partitioned_tier made local_cache: close() frees it
        self._owner_pid = os.getpid()
        self._pusher: _Pusher | None = None
        self._pusher_pid = -1

    def get(self, index: int) -> bytes | memoryview | None:
        owner = self.owners.owner(index)
        if owner == self.node and self.local_cache is not None:
            raw = self.local_cache.get(index)
        else:
            raw = self.client.get(owner, index)
            if raw is not None:
                return raw  # counted as remote_hits by the client
        self.counters.add("cache_hits" if raw is not None else "cache_misses")
        return raw

    def offer(self, index: int, raw: bytes | memoryview) -> None:
        owner = self.owners.owner(index)
        if owner == self.node and self.local_cache is not None:
            self.local_cache.put(index, raw)
        elif self.push and not self.client.is_down(owner):
            self._get_pusher().submit(owner, index, bytes(raw))

    def _get_pusher(self) -> _Pusher:
        if self._pusher is None or self._pusher_pid != os.getpid():
            self._pusher = _Pusher(self.client)
            self._pusher_pid = os.getpid()
        return self._pusher

    def flush(self, timeout_s: float = _PUSH_FLUSH_S) -> None:
        """Wait (bounded) until this process's pending pushes are sent."""
        if self._pusher is not None and self._pusher_pid == os.getpid():
            self._pusher.flush(timeout_s)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.peer_counters.snapshot())
        if self.local_cache is not None:
            out.update(self.local_cache.stats())
        out["partition_node"] = self.node
        out["partition_nodes"] = self.owners.num_nodes
        out["partition_owned_items"] = self.owners.counts()[self.node]
        return out

    def close(self) -> None:
        """Flush pushes, stop the node's server (leader only) and close connections."""
        self.flush()
        self.client.close()
        if os.getpid() != self._owner_pid:
            return  # a forked copy: the server and the cache belong to the process that made them
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.owns_cache and self.local_cache is not None:
            self.local_cache.close()
            self.local_cache = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["server"] = None  # the server stays in the process that runs it
        state["_pusher"] = None
        state["_pusher_pid"] = -1
        state["owns_cache"] = False
        return state


class _Pusher:
    """One background thread per process that sends items to their owners without stalling the worker."""

    def __init__(self, client: PeerClient) -> None:
        self.client = client
        self.q: queue.Queue = queue.Queue(maxsize=_PUSH_QUEUE_ITEMS)
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="coordl-push", daemon=True)
        self._thread.start()
        # DataLoader workers leave through multiprocessing's exit path, which runs Finalize hooks
        # (not atexit): flush there so the last pushes of an epoch are not lost.
        mp_util.Finalize(self, _Pusher.flush, args=(self, _PUSH_FLUSH_S), exitpriority=10)

    def submit(self, node: int, index: int, raw: bytes) -> None:
        try:
            self.q.put_nowait((node, index, raw))
        except queue.Full:
            self.dropped += 1  # the owner gets it from storage next time; never block a worker on this

    def _run(self) -> None:
        while True:
            node, index, raw = self.q.get()
            try:
                if not self.client.is_down(node):
                    self.client.put(node, index, raw)
            finally:
                self.q.task_done()

    def flush(self, timeout_s: float) -> None:
        done = threading.Event()

        def waiter() -> None:
            self.q.join()
            done.set()

        threading.Thread(target=waiter, daemon=True).start()
        done.wait(timeout_s)


# -- setting up a job's partitioned cache ------------------------------------------------------------

_RECORD_BYTES = 256  # one node leader's record in the address exchange: fixed size, plain text


def _exchange_records(topo: NodeTopology, record: str) -> list[str]:
    """All ranks' records (node leaders send theirs, others ""), via a tensor all_gather: no pickle."""
    import torch
    import torch.distributed as dist

    from coordl.errors import CoordlError

    if not (dist.is_available() and dist.is_initialized()):
        raise CoordlError(
            f"partitioned=True with WORLD_SIZE={topo.world_size} needs torch.distributed.init_process_group() "
            "to be called before the DataLoader is built (the nodes exchange cache-server addresses through it)"
        )
    raw = record.encode()
    if len(raw) > _RECORD_BYTES:
        raise CoordlError(f"peer record too long ({len(raw)} bytes): {record!r}")
    mine = torch.zeros(_RECORD_BYTES, dtype=torch.uint8)
    if raw:  # frombuffer refuses an empty buffer (ranks other than a node leader send "")
        mine[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    out = [torch.zeros_like(mine) for _ in range(topo.world_size)]
    dist.all_gather(out, mine)
    return [bytes(t.numpy()).rstrip(b"\0").decode() for t in out]


def _barrier(server: Any) -> None:
    import torch.distributed as dist

    try:
        dist.barrier()
    except BaseException:
        if server is not None:
            server.stop()
        raise


def build_partitioned_tier(
    num_items: int,
    cache_bytes: int,
    counters: SharedCounters,
    *,
    seed: int = 0,
    cache_dir: str | None = None,
    name: str | None = None,
    topology: NodeTopology | None = None,
    push: bool = True,
    timeout_s: float = 10.0,
    backoff_s: float = 30.0,
) -> PartitionedTier:
    """Make this process's :class:`PartitionedTier`: cache and server on node leaders, addresses exchanged.

    Every rank of the job must call this at the same point (it runs one collective when
    ``WORLD_SIZE > 1``). ``cache_bytes`` is this node's budget; the owner map weights nodes by it.
    """
    from coordl.errors import CoordlError
    from coordl.minio import MinioCache
    from coordl.peer import PeerServer

    topo = topology or NodeTopology.from_env()
    local_cache = None
    server = None
    if topo.is_node_leader:
        local_cache = MinioCache(cache_bytes, num_items, directory=cache_dir, name=name)
    owners_ref: list[OwnerMap] = []
    if topo.world_size > 1:
        if topo.is_node_leader:
            # Admit a PUT only for items this node owns (the map is known once the exchange is done).
            server = PeerServer(
                local_cache, accepts=lambda i: bool(owners_ref) and owners_ref[0].owner(i) == topo.node
            )
            record = (
                f"{topo.node} {advertise_address()} {server.address[1]} {int(cache_bytes)} {num_items} {seed}"
            )
        else:
            record = ""
        try:
            records = [r.split() for r in _exchange_records(topo, record) if r]
        except BaseException:
            if server is not None:
                server.stop()
            raise
        nodes: dict[int, list[str]] = {int(r[0]): r for r in records}
        for r in records:
            if (int(r[4]), int(r[5])) != (num_items, seed):
                raise CoordlError(
                    f"node {r[0]} built its partitioned cache for {r[4]} items with seed {r[5]}, this node for "
                    f"{num_items} items with seed {seed}: every rank must use the same dataset and seed"
                )
        if sorted(nodes) != list(range(topo.num_nodes)):
            raise CoordlError(
                f"expected one cache server per node 0..{topo.num_nodes - 1}, got nodes {sorted(nodes)}"
            )
        addresses = [(nodes[k][1], int(nodes[k][2])) for k in range(topo.num_nodes)]
        weights = [int(nodes[k][3]) for k in range(topo.num_nodes)]
    else:
        addresses, weights = [None], [int(cache_bytes)]
    owners = OwnerMap(num_items, weights, seed=seed)
    owners_ref.append(owners)
    if topo.world_size > 1:
        # A rank can leave the exchange before its peers have built their maps; a PUT that reached
        # a server without one was answered and dropped (an extra storage read next epoch). No rank
        # returns, and so none pushes, until every server admits its items.
        _barrier(server)
    client = PeerClient(addresses, timeout_s=timeout_s, backoff_s=backoff_s)
    tier = PartitionedTier(owners, topo.node, client, counters, local_cache=local_cache, push=push)
    tier.server = server
    tier.owns_cache = local_cache is not None
    log.info(
        "coordl: partitioned cache: node %d of %d owns %d of %d items; servers %s",
        topo.node, topo.num_nodes, owners.counts()[topo.node], num_items, addresses,
    )  # fmt: skip
    return tier


# -- hooks called by coordl.DataLoader(partitioned=True) ---------------------------------------------


def loader_tier(loader: Any) -> PartitionedTier:
    """The fetch tier of a ``coordl.DataLoader(..., cache_bytes=, partitioned=True)``."""
    if loader.cache_bytes <= 0:
        raise ValueError("partitioned=True needs cache_bytes > 0: this node's share of the partitioned cache")
    if getattr(loader.source, "opaque", False):
        raise ValueError(
            f"partitioned=True needs raw item bytes, but {type(loader.dataset).__name__} has no fetch/prep "
            "split (use coordl.ImageFolder or implement fetch/prep)"
        )
    return build_partitioned_tier(
        len(loader.source),
        loader.cache_bytes,
        loader._counters,
        cache_dir=loader.cache_dir,
        name=type(loader.dataset).__name__,
    )


def loader_sampler(loader: Any, shuffle: bool | None) -> PartitionedSampler:
    """This rank's sampler for ``partitioned=True`` when the user passed none (shuffle as in torch)."""
    topo = NodeTopology.from_env()
    return PartitionedSampler(len(loader.source), topo.world_size, topo.rank, shuffle=bool(shuffle))

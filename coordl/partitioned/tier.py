"""Setting up a job's partitioned cache: exchange addresses and the secret, then build server, client, tier.

Every rank calls :func:`build_partitioned_tier` at the same point. On each node leader the listening
socket is bound first (to the address the node advertises), its port goes into the start-up
``all_gather`` with the node's cache budget and rank 0's secret, and only then is the node's server
built, complete, with the job's owner map (who owns item i follows from a shared seed and the budgets,
:class:`~coordl.partitioned.ownership.OwnerMap`: no metadata service). The fetch tier itself is
:class:`coordl.partitioned.fetch.PartitionedTier` (re-exported here).

Two transports (``transport=`` or ``COORDL_PEER_TRANSPORT``): ``"tcp"`` (default), the hardened
:class:`~coordl.partitioned.server.PeerServer`; ``"redis"``, one ``redis-server`` per node
(:mod:`coordl.partitioned.redis_peer`). ``docs/distributed.md`` has the measurements behind the default.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from coordl.partitioned.auth import SECRET_ENV, check_secret, fingerprint, new_secret, secret_from_env
from coordl.partitioned.fetch import PartitionedTier
from coordl.partitioned.ownership import NodeTopology, OwnerMap
from coordl.partitioned.peer import PeerClient, advertise_address
from shmem.counters import SharedCounters

__all__ = ["PartitionedTier", "build_partitioned_tier", "TRANSPORT_ENV"]

log = logging.getLogger("coordl")
TRANSPORT_ENV = "COORDL_PEER_TRANSPORT"

_RECORD_BYTES = 320  # one node leader's record in the address exchange: fixed size, plain text


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
    local_cache: Any,
    *,
    seed: int = 0,
    topology: NodeTopology | None = None,
    push: bool = True,
    timeout_s: float = 10.0,
    backoff_s: float = 30.0,
    secret: bytes | str | None = None,
    item_size: Callable[[int], int] | None = None,
    max_item_bytes: int | None = None,
    bind_host: str | None = None,
    transport: str | None = None,
    identity: str | None = None,
) -> PartitionedTier:
    """Make this process's :class:`PartitionedTier`: addresses and secret exchanged, then the server built.

    Why this function is long: the start-up protocol (bind, exchange, check every node's record, agree on
    the secret, build the server complete, barrier) reads in order here; each step is a few lines.

    Every rank of the job must call this at the same point (it runs two collectives when
    ``WORLD_SIZE > 1``). ``cache_bytes`` is this node's budget; the owner map weights nodes by it.
    ``local_cache`` is the node's MinIO cache on the node leader (None on the node's other ranks); the
    caller made it and closes it.

    Args:
        secret: the job's peer secret; else ``COORDL_PEER_SECRET``; else rank 0 makes one and sends it
            to the ranks in the start-up exchange (readable by whoever can read the rendezvous: see
            docs/distributed.md).
        item_size: the dataset's byte length of item ``i``; when given, a PUT of another length is
            refused. Without it a PUT is only bounded by ``max_item_bytes``.
        max_item_bytes: the largest item a peer may send this node (default: ``min(cache_bytes, 256 MiB)``,
            as an item larger than the node's whole budget could not be cached anyway).
        bind_host: the address the server listens on (default ``COORDL_PEER_BIND``, else the address it
            advertises to its peers, see :func:`~coordl.partitioned.peer.advertise_address`).
        transport: ``"tcp"`` (default) or ``"redis"`` (default ``COORDL_PEER_TRANSPORT``).
    """
    from coordl.partitioned.server import PeerServer, bind_listener

    topo = topology or NodeTopology.from_env()
    if topo.is_node_leader != (local_cache is not None):
        raise ValueError("build_partitioned_tier: the node leader, and only it, passes its local_cache")
    user_secret = check_secret(secret, "secret=") if secret is not None else secret_from_env()
    listener = server = None
    if topo.world_size == 1:
        addresses, weights = [None], [int(cache_bytes)]
        job_secret = user_secret or new_secret()
    else:
        if topo.is_node_leader:
            advertised = advertise_address()
            listener = bind_listener(bind_host or os.environ.get("COORDL_PEER_BIND") or advertised)
        try:
            addresses, weights, job_secret = _exchange(
                topo, listener, user_secret, num_items, cache_bytes, seed
            )
        except BaseException:
            if listener is not None:
                listener.close()
            raise
    owners = OwnerMap(num_items, weights, seed=seed)
    kind = _transport(transport)
    if listener is not None:
        node = topo.node
        if kind == "redis":
            server = _start_redis(listener, job_secret, cache_bytes)
        else:
            server = PeerServer(
                local_cache,
                secret=job_secret,
                owns=lambda i: owners.owner(i) == node,
                listener=listener,
                item_size=item_size,
                max_item_bytes=max_item_bytes or min(int(cache_bytes), 256 << 20),
            )
        _barrier(server)  # every server is up before any rank fetches or pushes
    elif topo.world_size > 1:
        _barrier(None)
    if kind == "redis":
        from coordl.partitioned.redis_peer import RedisPeerClient, key_prefix

        ident = f"{identity or 'job:' + fingerprint(job_secret)}|{num_items}"
        client: Any = RedisPeerClient(
            addresses, password=job_secret.hex(), prefix=key_prefix(ident), item_size=item_size,
            timeout_s=timeout_s, backoff_s=backoff_s,
        )  # fmt: skip
    else:
        client = PeerClient(addresses, secret=job_secret, timeout_s=timeout_s, backoff_s=backoff_s)
    tier = PartitionedTier(
        owners, topo.node, client, counters, local_cache=local_cache, push=push, server=server,
        mirror_local=kind == "redis" and topo.world_size > 1,
    )  # fmt: skip
    log.info(
        "coordl: partitioned cache: node %d of %d owns %d of %d items; servers %s",
        topo.node, topo.num_nodes, owners.counts()[topo.node], num_items, addresses,
    )  # fmt: skip
    return tier


def _transport(transport: str | None) -> str:
    kind = (transport or os.environ.get(TRANSPORT_ENV) or "redis").lower()
    if kind not in ("tcp", "redis"):
        raise ValueError(
            f"partitioned cache transport must be 'tcp' or 'redis', got {kind!r} ({TRANSPORT_ENV})"
        )
    return kind


def _start_redis(listener: Any, secret: bytes, cache_bytes: int) -> Any:
    """This node's redis-server on the port the listener reserved (exchanged already), like ``memcache serve``.

    ``maxmemory`` is the budget plus 30 % and 64 MiB for Redis's per-key and frame overhead.
    """
    from memcache.server import start_redis

    host, port = listener.getsockname()[:2]
    listener.close()  # hand the reserved port to redis-server
    return start_redis(
        int(cache_bytes * 1.3) + (64 << 20), host=host, port=port, password=secret.hex(), die_with_parent=True
    )


def _exchange(
    topo: NodeTopology,
    listener: Any,
    user_secret: bytes | None,
    num_items: int,
    cache_bytes: int,
    seed: int,
) -> tuple[list[tuple[str, int] | None], list[int], bytes]:
    """Every node's server address and budget, and the job's secret, through one all_gather.

    A node leader's record: ``node host port cache_bytes num_items seed fingerprint secret`` where
    ``secret`` is the hex secret rank 0 made when the user gave none ("-" otherwise, or from other ranks).
    """
    from coordl.errors import CoordlError

    made = new_secret() if topo.rank == 0 and user_secret is None else None
    if listener is not None:
        host, port = listener.getsockname()[:2]
        fp = fingerprint(user_secret or made) if (user_secret or made) else "-"
        record = f"{topo.node} {host} {port} {int(cache_bytes)} {num_items} {seed} {fp} {made.hex() if made else '-'}"
    else:
        record = ""
    records = [r.split() for r in _exchange_records(topo, record) if r]
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
    # Rank 0 (always a node leader, so records[0]) either sends the secret it made or holds the user's:
    # its fingerprint is the job's. Every leader checks the same records, so all fail together.
    sent = [bytes.fromhex(r[7]) for r in records if r[7] != "-"]
    ref = records[0][6]
    allowed = {ref, "-"} if sent else {ref}
    odd = [r[0] for r in records if r[6] not in allowed]
    if odd:
        raise CoordlError(
            f"node(s) {', '.join(odd)} hold another peer secret than rank 0 ({SECRET_ENV} or secret=): "
            "set the same secret on every rank, or none (rank 0 then makes one)"
        )
    if user_secret is None and not sent:
        raise CoordlError(
            f"rank 0 holds a peer secret ({SECRET_ENV} or secret=) and this rank none: set it on every rank"
        )
    job_secret = user_secret if user_secret is not None else sent[0]
    if fingerprint(job_secret) != ref:
        raise CoordlError(f"this rank's peer secret ({SECRET_ENV} or secret=) differs from rank 0's")
    addresses = [(nodes[k][1], int(nodes[k][2])) for k in range(topo.num_nodes)]
    weights = [int(nodes[k][3]) for k in range(topo.num_nodes)]
    return addresses, weights, job_secret

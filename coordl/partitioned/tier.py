"""Setting up a job's partitioned cache: each node's Redis, the exchange of addresses and secret, the tier.

Every rank calls :func:`build_partitioned_tier` at the same point. Each node leader first has its
node's Redis ready: either the node's own ``memcache serve`` (``COORDL_PEER_REDIS=host:port``, password
``MEMCACHE_PASSWORD``: one Redis per node for the sample cache and this one, keys apart) or a
``redis-server`` it starts itself exactly as ``memcache serve`` does (:func:`memcache.server.start_redis`:
bound to the node's advertised address, no persistence, ``maxmemory`` with ``noeviction``), which dies
with it. Then the records go through one ``all_gather`` (:mod:`coordl.partitioned.rendezvous`), a
self-started Redis takes the job's secret as its password, and a barrier ends the set-up. Who owns item
``i`` follows from a shared seed and the budgets (:class:`~coordl.partitioned.ownership.OwnerMap`): no
metadata service. The fetch tier itself is :class:`coordl.partitioned.fetch.PartitionedTier`.
With ``tls=True`` (the loader's ``partitioned=PartitionedOptions(tls=True)``, or ``COORDL_PEER_TLS=1``)
every node's Redis speaks TLS only, client certificates required (:mod:`coordl.partitioned.peer_tls`).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from typing import Any

from coordl.partitioned import peer_tls
from coordl.partitioned.fetch import PartitionedTier
from coordl.partitioned.options import PUSH_WAIT_S
from coordl.partitioned.ownership import NodeTopology, OwnerMap
from coordl.partitioned.redis_peer import RedisPeerClient, key_prefix
from coordl.partitioned.rendezvous import (
    advertise_address,
    check_secret,
    exchange,
    fingerprint,
    new_secret,
    secret_from_env,
)
from memcache.tls import TLS, split_url
from shmem.counters import SharedCounters

__all__ = ["PartitionedTier", "build_partitioned_tier", "REDIS_ENV", "redis_maxmemory"]

log = logging.getLogger("coordl")
REDIS_ENV = "COORDL_PEER_REDIS"  # this node's Redis ("host:port", e.g. from `memcache serve`)
PASSWORD_ENV = "MEMCACHE_PASSWORD"  # that Redis's password, as for memcache.RedisStore


def redis_maxmemory(cache_bytes: int) -> int:
    """A self-started node Redis's ``maxmemory``: the budget plus 30 % and 64 MiB for per-key overhead."""
    return int(cache_bytes * 1.3) + (64 << 20)


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
    bind_host: str | None = None,
    redis: str | None = None,
    identity: str | None = None,
    tls: TLS | bool | None = None,
    push_wait_s: float = PUSH_WAIT_S,
) -> PartitionedTier:
    """Make this process's :class:`PartitionedTier`: node Redis ready, addresses and secret exchanged.

    Why this function is long: the start-up protocol (Redis ready, exchange, password, barrier, client)
    reads in order here; each step is a few lines.

    Every rank of the job must call this at the same point (it runs two collectives when
    ``WORLD_SIZE > 1``). ``cache_bytes`` is this node's budget; the owner map weights nodes by it.
    ``local_cache`` is the node's MinIO cache on the node leader (None on the node's other ranks); the
    caller made it and closes it.

    Args:
        secret: the job's secret; else ``COORDL_PEER_SECRET``; else rank 0 makes one and sends it to the
            ranks in the start-up exchange. The password of the Redis servers the job starts.
        item_size: the dataset's byte length of item ``i``; a cached value of another length is refused.
        bind_host: where a self-started Redis listens (default ``COORDL_PEER_BIND``, else the address it
            advertises to its peers, see :func:`~coordl.partitioned.rendezvous.advertise_address`).
        redis: this node's own Redis, ``"host:port"`` (default ``COORDL_PEER_REDIS``), e.g. started by
            ``memcache serve``; its password is ``MEMCACHE_PASSWORD``. None: the node leader starts one.
        identity: names the dataset (``coordl.fetch.node_cache.data_identity``): the keys' prefix, so a
            shared Redis never serves another dataset's item. None: the job's own prefix.
        tls: True: the nodes' Redis speak TLS only (certificates of a CA derived from the job's secret,
            which on more than one node must then be the user's: ``secret=`` or ``COORDL_PEER_SECRET``;
            or ``MEMCACHE_TLS_*`` files when set); a :class:`memcache.TLS`: those files; False: plain
            text; None (default): ``COORDL_PEER_TLS``, or what a ``rediss://`` ``redis`` address says.
            A loader passes its ``partitioned=PartitionedOptions(tls=...)`` here.
        push_wait_s: at an epoch's end, how long :meth:`PartitionedTier.end_epoch` waits at most for
            the items sent to their owners in the background.
    """
    topo = topology or NodeTopology.from_env()
    if topo.is_node_leader != (local_cache is not None):
        raise ValueError("build_partitioned_tier: the node leader, and only it, passes its local_cache")
    user_secret = check_secret(secret, "secret=") if secret is not None else secret_from_env()
    external = redis if redis is not None else os.environ.get(REDIS_ENV) or None
    client_tls: TLS | None = None
    if external:
        external, url_says = split_url(external)
        client_tls = peer_tls.external_tls(tls, url_says)
        want: TLS | bool = client_tls or False
    else:
        want = peer_tls.wanted(tls)
    server = None
    boot_dir = None
    if topo.world_size == 1:  # one node: its MinIO cache is the whole partitioned cache, no Redis
        addresses: list[Any] = [None]
        weights, job_secret, shared = [int(cache_bytes)], user_secret or new_secret(), False
    else:
        mine = None
        if topo.is_node_leader:
            if external:
                mine = (*_parse_address(external), True, _check_external(external, client_tls))
            else:
                advertised = advertise_address()
                server_tls = want if isinstance(want, TLS) else None
                if (
                    want is True
                ):  # the job's certificates once the secret is agreed; a throw-away CA till then
                    server_tls, boot_dir = peer_tls.boot_tls()
                server = _start_node_redis(
                    bind_host or os.environ.get("COORDL_PEER_BIND") or advertised, cache_bytes, server_tls
                )
                wildcard = server.host in (
                    "0.0.0.0",
                    "::",
                    "",
                )  # listening everywhere: peers use the advertised one
                mine = (advertised if wildcard else server.host, server.port, False, "ok")
        try:
            agreed = exchange(
                topo, mine, user_secret, num_items, cache_bytes, seed, tls=bool(want), secret_ca=want is True
            )
            if server is not None:
                hosts = [mine[0]] if mine is not None else []
                peer_tls.switch_server(server, agreed.secret, hosts, agreed.secret.hex(), boot_dir)
        except BaseException:
            if server is not None:
                server.stop()
            if boot_dir is not None:
                shutil.rmtree(boot_dir, ignore_errors=True)
            raise
        addresses, weights, job_secret, shared = (
            agreed.addresses,
            agreed.weights,
            agreed.secret,
            agreed.shared,
        )
        _barrier(server)  # every node's Redis takes the job's password before any rank fetches or pushes
    owners = OwnerMap(num_items, weights, seed=seed)
    password = (os.environ.get(PASSWORD_ENV) or None) if shared else job_secret.hex()
    if topo.world_size > 1 and not external and want:
        client_tls = want if isinstance(want, TLS) else peer_tls.client_tls(job_secret)
    prefix = key_prefix(f"{identity or 'job:' + fingerprint(job_secret)}|{num_items}")
    client = RedisPeerClient(
        addresses, password=password, prefix=prefix, item_size=item_size, timeout_s=timeout_s,
        backoff_s=backoff_s, tls=client_tls,
    )  # fmt: skip
    tier = PartitionedTier(
        owners, topo.node, client, counters, local_cache=local_cache, push=push, server=server,
        mirror_local=topo.world_size > 1, push_wait_s=push_wait_s,
    )  # fmt: skip
    log.info(
        "coordl: partitioned cache: node %d of %d owns %d of %d items; Redis %s%s",
        topo.node, topo.num_nodes, owners.counts()[topo.node], num_items, addresses,
        " over TLS" if client_tls is not None else "",
    )  # fmt: skip
    return tier


def _parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{REDIS_ENV} (or redis=) must be 'host:port', got {text!r}")
    return host.strip("[]"), int(port)


def _check_external(address: str, tls: TLS | None) -> str:
    """``ok``, or one word saying why this node's own Redis cannot be used (``wrongpass``, ``unreachable``,
    ``error``), sent in the exchange so that every rank raises the same error."""
    import redis

    host, port = _parse_address(address)
    try:
        extra = tls.client_kwargs() if tls is not None else {}
        redis.Redis(
            host=host, port=port, password=os.environ.get(PASSWORD_ENV) or None, socket_timeout=5, **extra
        ).ping()
    except redis.AuthenticationError:
        return "wrongpass"
    except redis.ResponseError as exc:  # NOAUTH: it has a password and none was given
        return "wrongpass" if "NOAUTH" in str(exc) else "error"
    except (redis.RedisError, OSError):
        return "unreachable"
    return "ok"


def _start_node_redis(host: str, cache_bytes: int, tls: TLS | None) -> Any:
    """This node's redis-server, as ``memcache serve`` starts one, that dies with this process.

    It starts with a throw-away password (the job's secret is known only after the exchange).
    """
    from memcache.server import start_redis

    return start_redis(
        redis_maxmemory(cache_bytes), host=host, password=new_secret().hex(), die_with_parent=True, tls=tls
    )

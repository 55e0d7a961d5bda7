"""Setting up a partitioned cache across two real processes (gloo on loopback): no push is lost at the
start; one Redis per node shared with the sample cache (``memcache serve``), keys apart; a wrong
password is one clear error on every rank."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from memcache.server import start_redis

RANK_SCRIPT = r"""
import datetime, os, sys, time
import torch.distributed as dist
import coordl.partitioned.ownership as own
import coordl.partitioned.tier as part
from coordl.errors import CoordlError
from coordl.fetch.minio import MinioCache
from shmem.counters import SharedCounters

slow = float(sys.argv[1])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
if rank == 1:
    # This node builds its owner map late (a loaded machine): rank 0 leaves the address exchange
    # first and pushes at once.
    real = own.OwnerMap.__init__
    def late(self, *a, **k):
        time.sleep(slow)
        real(self, *a, **k)
    own.OwnerMap.__init__ = late
n = 40
cache = MinioCache(1 << 20, n) if own.NodeTopology.from_env().is_node_leader else None
try:
    tier = part.build_partitioned_tier(n, 1 << 20, SharedCounters(["cache_hits", "cache_misses"]), cache,
                                       seed=3, identity="setup-test")
except CoordlError as exc:
    print("ERROR", exc, flush=True)
    sys.exit(3)
theirs = [i for i in range(n) if tier.owners.owner(i) == 1 - rank]
if rank == 0:
    for i in theirs:
        tier.offer(i, bytes([i]) * 100)
    tier.flush()
dist.barrier()
if rank == 1:
    mine = [i for i in range(n) if tier.owners.owner(i) == 1]
    have = [i for i in mine if tier.get(i) is not None]
    print("HAVE", len(have), "OF", len(mine), flush=True)
dist.barrier()
tier.close()
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(tmp_path: Path, envs: list[dict]) -> list[tuple[int, str, str]]:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_RANK="0",
            LOCAL_WORLD_SIZE="1",
            GROUP_RANK=str(rank),
            COORDL_PEER_ADDR="127.0.0.1",
            **envs[rank],
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), "1.0"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        )
    outs = [p.communicate(timeout=120) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs, strict=True)]


def _have(results: list[tuple[int, str, str]]) -> None:
    for rc, _out, err in results:
        assert rc == 0, err[-2000:]
    line = next(ln for ln in results[1][1].splitlines() if ln.startswith("HAVE"))
    _, have, _, mine = line.split()
    assert int(mine) > 0
    assert have == mine, line  # every item rank 0 pushed at once is in its owner's Redis


@pytest.mark.redis
def test_pushes_sent_right_after_setup_reach_a_late_owner(tmp_path: Path) -> None:
    _have(_run(tmp_path, [{}, {}]))


@pytest.mark.redis
def test_one_redis_per_node_shared_with_the_sample_cache(tmp_path: Path) -> None:
    """Each node's Redis started as ``memcache serve`` starts it holds both caches, keys apart."""
    import redis

    from memcache import RedisStore

    password = "shared-node-redis-0123456789"
    servers = [start_redis(64 << 20, password=password) for _ in range(2)]
    try:
        store = RedisStore([s.address for s in servers], password=password)
        samples = {f"mc1:sample:{i}": np.full(3, i, np.int32) for i in range(20)}
        assert store.put_many(samples) == 20
        envs = [{"COORDL_PEER_REDIS": s.address, "MEMCACHE_PASSWORD": password} for s in servers]
        _have(_run(tmp_path, envs))
        got = store.get_many(list(samples))  # the sample cache's values are untouched
        assert all(np.array_equal(got[k], v) for k, v in samples.items())
        keys = [
            k.decode() for s in servers for k in redis.Redis(s.host, s.port, password=password).scan_iter()
        ]
        assert {k.split(":")[0] for k in keys} == {"mc1", "cdl1"}
        assert sum(k.startswith("cdl1:") for k in keys) > 0
    finally:
        for s in servers:
            s.stop()


@pytest.mark.redis
def test_wrong_password_for_a_shared_redis_is_one_clear_error_on_every_rank(tmp_path: Path) -> None:
    servers = [start_redis(64 << 20, password="the-right-password-0123") for _ in range(2)]
    try:
        envs = [
            {"COORDL_PEER_REDIS": s.address, "MEMCACHE_PASSWORD": "a-wrong-password-0123"} for s in servers
        ]
        results = _run(tmp_path, envs)
    finally:
        for s in servers:
            s.stop()
    for rc, out, err in results:
        assert rc == 3, err[-2000:]
        assert "refused the password in MEMCACHE_PASSWORD" in out and out.count("ERROR") == 1
        assert "Traceback" not in err

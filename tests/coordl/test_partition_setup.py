"""Setting up a partitioned cache across two real processes (gloo on loopback): no push is lost at the start."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

RANK_SCRIPT = r"""
import datetime, os, sys, time
import torch.distributed as dist
import coordl.partitioned.ownership as own
import coordl.partitioned.tier as part
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
tier = part.build_partitioned_tier(n, 1 << 20, SharedCounters(["cache_hits", "cache_misses"]), cache, seed=3)
theirs = [i for i in range(n) if tier.owners.owner(i) == 1 - rank]
if rank == 0:
    for i in theirs:
        tier.offer(i, bytes([i]) * 100)
    tier.flush()
dist.barrier()
if rank == 1:
    mine = [i for i in range(n) if tier.owners.owner(i) == 1]
    have = [i for i in mine if tier.local_cache.get(i) is not None]
    print("HAVE", len(have), "OF", len(mine), flush=True)
dist.barrier()
tier.close()
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_pushes_sent_right_after_setup_reach_a_late_owner(tmp_path: Path) -> None:
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
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), "1.0"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_o, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    line = next(ln for ln in outs[1][0].splitlines() if ln.startswith("HAVE"))
    _, have, _, mine = line.split()
    assert int(mine) > 0
    assert have == mine, line  # every item rank 0 pushed at once is in its owner's cache

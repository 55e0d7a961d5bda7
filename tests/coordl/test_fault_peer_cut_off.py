"""Fault: a peer of a partitioned job is cut off from the network (alive, but its link is down).

Promise, through ``coordl.DataLoader(partitioned=True)`` with real workers: the next epoch completes
on the other node with every item; the items the lost peer owned come from storage after one peer
timeout per process (then the peer is backed off), not one timeout per item, so the epoch ends in a
bounded time. Two network namespaces joined by a veth pair; ``ip link set down`` cuts the link.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.netns import VirtualNetwork, skip_reason

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.redis]

N_ITEMS = 80
# The loader's Redis client waits at most 3 s to connect (the epoch's fresh workers) and 10 s for a
# reply on an open connection. The two workers each pay one timeout, concurrently; one per item would
# cost ~20 x 3 s or more. Bound: three of the longer timeouts.
PEER_TIMEOUT_S = 10.0
EPOCH_BOUND_S = 3 * PEER_TIMEOUT_S

SCRIPT = r"""
import datetime, json, os, sys, time
import torch.distributed as dist
import coordl

class Items:
    def __init__(self, n): self.n = n
    def __len__(self): return self.n
    def fetch(self, i): return (i.to_bytes(4, "little") * 2500)[: 5000 + i]
    def prep(self, raw, i):
        assert raw == self.fetch(i), i
        return i

n_items, go_file = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
per_node = sum(5000 + i for i in range(n_items)) // 2 + 50_000
loader = coordl.DataLoader(Items(n_items), batch_size=5, shuffle=True, num_workers=2, cache_bytes=per_node,
                           partitioned=True)
loader.sampler.set_epoch(0)
first = sorted(int(x) for b in loader for x in b)
dist.barrier()  # every push of epoch 0 landed; no collective after this one
if rank == 1:
    print("CUT ME", flush=True)
    time.sleep(600)  # alive but unreachable: the test takes its link down
print("SYNC", flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(go_file) and time.monotonic() < deadline:
    time.sleep(0.05)
loader.sampler.set_epoch(1)
t0 = time.monotonic()
seen = sorted(int(x) for b in loader for x in b)
secs = time.monotonic() - t0
ep = loader.epoch_stats()[-1]
st = loader.stats()
print(json.dumps({"first": first, "seen": seen, "secs": secs, "storage_items_read": ep["storage_items_read"],
                  "remote_errors": st["remote_errors"], "expected": sorted(int(i) for i in loader.sampler.indices())}), flush=True)
os._exit(0)  # the process group cannot be torn down with the peer unreachable
"""


@pytest.fixture(autouse=True)
def _needs_netns() -> None:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)


@pytest.mark.timeout(240)
def test_cut_off_peer_costs_one_timeout_then_storage(tmp_path: Path) -> None:
    script, go = tmp_path / "rank.py", tmp_path / "go"
    script.write_text(SCRIPT)
    with VirtualNetwork(2, rate_mbit=200, prefix="cdlfault") as net:
        port = net.hosts[0].free_port()
        procs = [
            h.popen(
                [sys.executable, str(script), str(N_ITEMS), str(go)],
                env=net.dist_env(r, master_port=port),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for r, h in enumerate(net.hosts)
        ]
        try:
            assert procs[1].stdout.readline().strip() == "CUT ME", procs[1].stderr.read()[-3000:]
            assert procs[0].stdout.readline().strip() == "SYNC", procs[0].stderr.read()[-3000:]
            net.hosts[1].run(["ip", "link", "set", net.hosts[1].ifname, "down"])
            go.touch()
            t0 = time.monotonic()
            out, err = procs[0].communicate(timeout=120)
            elapsed = time.monotonic() - t0
            assert procs[0].returncode == 0, err[-3000:]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(30)
    rec = json.loads(out.strip().splitlines()[-1])
    assert rec["seen"] == rec["expected"] and len(rec["seen"]) == N_ITEMS // 2  # the whole shard
    # The peer was tried and failed, once per reading process (main + 2 workers, each of which may
    # also have a push in flight), never once per item.
    assert 1 <= rec["remote_errors"] <= 6
    # Items owned by the lost peer came from storage; rank 0's own share from its cache.
    assert 0 < rec["storage_items_read"] < len(rec["seen"])
    assert rec["secs"] < EPOCH_BOUND_S and elapsed < EPOCH_BOUND_S + 30, rec["secs"]

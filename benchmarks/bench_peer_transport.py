"""Peer path of the partitioned cache: a node's Redis read by :class:`RedisPeerClient`, batch by batch.

Two emulated nodes (network namespaces, :class:`tests.support.netns.VirtualNetwork`) joined by links of
``--mbit`` (tc tbf; ``0`` = unthrottled veth). Node 0 runs ``redis-server`` started as ``memcache serve``
does (``requirepass``, ``noeviction``) holding ``--items`` items of ``--item-kb`` KiB as the loader
stores them (:mod:`shmem.codec` frames); node 1 reads them with one ``MGET`` per batch (redis-py +
hiredis, :mod:`coordl.partitioned.redis_peer`).

The home-made transport this was measured against until issue 48 (``tcp``) was deleted after the
comparison; the side-by-side version of this script is in commit edc8685.

Node 1 runs one client process that asks for random batches of ``--batch`` items for ``--seconds``
(after a warm-up), the way a DataLoader worker asks for one batch's remote items. Reported per
link (median of ``--reps`` runs): items/s, MB/s, client CPU seconds per 1000 items (the client
process's user+system time) and server CPU seconds per 1000 items (``redis-server``'s, read from /proc
through psutil).

Run (root, ~2 minutes): ``.venv/bin/python benchmarks/bench_peer_transport.py``
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for tests.support

SECRET = "bench-peer-transport-secret-0123456789abcdef"

SERVER = r"""
import os, sys
import numpy as np
ip, n_items, item_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
secret = os.environ["BENCH_SECRET"].encode()
rng = np.random.default_rng(0)
blob = rng.integers(0, 256, n_items + item_bytes, dtype=np.uint8).tobytes()
item = lambda i: blob[i : i + item_bytes]
import redis
from memcache.server import start_redis
from coordl.partitioned.redis_peer import encode_item, key_prefix
from coordl.partitioned.tier import redis_maxmemory
item_key = lambda i: key_prefix("bench") + str(i)
server = start_redis(redis_maxmemory(n_items * item_bytes), host=ip, password=secret.hex(), die_with_parent=True)
r = redis.Redis(host=ip, port=server.port, password=secret.hex())
pipe = r.pipeline(transaction=False)
for i in range(n_items):
    pipe.set(item_key(i), encode_item(item_key(i), item(i)))
pipe.execute()
port, pid = server.port, server.pid
print(port, pid, flush=True)
sys.stdin.read()  # until the driver closes our stdin
server.stop()
"""

CLIENT = r"""
import json, os, sys, time
import numpy as np
ip, port, n_items, batch, seconds = sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:5]), float(sys.argv[5])
secret = os.environ["BENCH_SECRET"].encode()
from coordl.partitioned.redis_peer import RedisPeerClient, key_prefix
client = RedisPeerClient([(ip, port)], password=secret.hex(), prefix=key_prefix("bench"), timeout_s=30)
rng = np.random.default_rng(1)
def one():
    idx = rng.choice(n_items, batch, replace=False).tolist()
    got = client.fetch({0: idx})
    assert len(got) == batch, (len(got), batch)
    return sum(len(v) for v in got.values())
for _ in range(5):
    one()  # warm-up: connections, handshakes, page faults
print("READY", flush=True)
sys.stdin.readline()  # the driver has read the server's CPU time
items = nbytes = 0
c0, t0 = time.process_time(), time.perf_counter()
while time.perf_counter() - t0 < seconds:
    nbytes += one()
    items += batch
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({"items": items, "bytes": nbytes, "wall": wall, "client_cpu": cpu}), flush=True)
"""


def cpu_of(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def run_once(args: argparse.Namespace, mbit: float, tmp: Path) -> dict:
    from tests.support.netns import VirtualNetwork

    (tmp / "server.py").write_text(SERVER)
    (tmp / "client.py").write_text(CLIENT)
    env = {"BENCH_SECRET": SECRET, "OMP_NUM_THREADS": "1"}
    item_bytes = args.item_kb * 1024
    with VirtualNetwork(2, rate_mbit=mbit or None, prefix="cdlbpt") as net:
        srv_host, cli_host = net.hosts
        server = srv_host.popen(
            [sys.executable, str(tmp / "server.py"), srv_host.ip, str(args.items), str(item_bytes)],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        port, pid = map(int, server.stdout.readline().split())
        client = cli_host.popen(
            [sys.executable, str(tmp / "client.py"), srv_host.ip, str(port), str(args.items),
             str(args.batch), str(args.seconds)],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert client.stdout.readline().strip() == "READY"
        s0 = cpu_of(pid)
        client.stdin.write("go\n")
        client.stdin.flush()
        rec = json.loads(client.stdout.readline())
        rec["server_cpu"] = cpu_of(pid) - s0
        client.wait(30)
        server.stdin.close()
        server.wait(30)
    return rec


def _median(runs: list[dict]) -> dict:
    return {
        "items_s": statistics.median(r["items"] / r["wall"] for r in runs),
        "mb_s": statistics.median(r["bytes"] / r["wall"] / 1e6 for r in runs),
        "client_cpu_ms_per_item": statistics.median(1e3 * r["client_cpu"] / r["items"] for r in runs),
        "server_cpu_ms_per_item": statistics.median(1e3 * r["server_cpu"] / r["items"] for r in runs),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--items", type=int, default=2000)
    p.add_argument("--item-kb", type=int, default=100)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument(
        "--mbit", type=float, nargs="+", default=[1000, 10000, 0], help="link rates; 0 = unthrottled"
    )
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    from tests.support.netns import skip_reason

    reason = skip_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    results: dict[str, dict] = {}
    print(f"{args.items} items x {args.item_kb} KiB, batches of {args.batch}, {args.seconds} s per run, "
          f"median of {args.reps} runs")  # fmt: skip
    print("| link | items/s | MB/s | client CPU s / 1000 items | server CPU s / 1000 items |")
    print("|---|---|---|---|---|")
    for mbit in args.mbit:
        link = f"{mbit:.0f} Mbit/s" if mbit else "unthrottled"
        runs = []
        for _ in range(args.reps):
            with tempfile.TemporaryDirectory() as tmp:
                runs.append(run_once(args, mbit, Path(tmp)))
        med = results[link] = _median(runs)
        print(f"| {link} | {med['items_s']:.0f} | {med['mb_s']:.0f} | {med['client_cpu_ms_per_item']:.3f} | "
              f"{med['server_cpu_ms_per_item']:.3f} |", flush=True)  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

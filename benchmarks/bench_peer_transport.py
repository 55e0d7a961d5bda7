"""Peer transport of the partitioned cache: the hardened home-made server vs Redis, side by side.

Two emulated nodes (network namespaces, :class:`tests.support.netns.VirtualNetwork`) joined by links of
``--mbit`` (tc tbf; ``0`` = unthrottled veth). Node 0 serves ``--items`` items of ``--item-kb`` KiB:

* ``tcp``: :class:`coordl.partitioned.server.PeerServer` over a MinIO cache (shared memory), 4 workers,
  HMAC handshake, batched GET of :mod:`shmem.codec` frames (CRC-checked on both sides);
* ``redis``: ``redis-server`` started as ``memcache serve`` does (``requirepass``, ``noeviction``), values
  are the same codec frames (CRC-checked by the reader), one ``MGET`` per batch (redis-py + hiredis).

Node 1 runs one client process that asks for random batches of ``--batch`` items for ``--seconds``
(after a warm-up), the way a DataLoader worker asks for one batch's remote items. Reported per
transport and link (median of ``--reps`` runs): items/s, MB/s, client CPU seconds per 1000 items (the
client process's user+system time) and server CPU seconds per 1000 items (the server process's, read
from /proc through psutil), and the ratio redis/tcp.

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
transport, ip, n_items, item_bytes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
secret = os.environ["BENCH_SECRET"].encode()
rng = np.random.default_rng(0)
blob = rng.integers(0, 256, n_items + item_bytes, dtype=np.uint8).tobytes()
item = lambda i: blob[i : i + item_bytes]
if transport == "tcp":
    from coordl.fetch.minio import MinioCache
    from coordl.partitioned.server import PeerServer
    cache = MinioCache(n_items * item_bytes + (1 << 20), n_items)
    for i in range(n_items):
        cache.put(i, item(i))
    server = PeerServer(cache, secret=secret, owns=lambda i: True, host=ip, max_item_bytes=item_bytes)
    port, pid = server.address[1], os.getpid()
else:
    import redis
    from memcache.server import start_redis
    from coordl.partitioned.redis_peer import encode_item, key_prefix
    item_key = lambda i: key_prefix("bench") + str(i)
    server = start_redis(int(n_items * item_bytes * 1.3) + (64 << 20), host=ip, password=secret.hex())
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
transport, ip, port, n_items, batch, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), *map(int, sys.argv[4:6]), float(sys.argv[6])
secret = os.environ["BENCH_SECRET"].encode()
if transport == "tcp":
    from coordl.partitioned.peer import PeerClient
    client = PeerClient([(ip, port)], secret=secret, timeout_s=30)
else:
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


def run_once(args: argparse.Namespace, transport: str, mbit: float, tmp: Path) -> dict:
    from tests.support.netns import VirtualNetwork

    (tmp / "server.py").write_text(SERVER)
    (tmp / "client.py").write_text(CLIENT)
    env = {"BENCH_SECRET": SECRET, "OMP_NUM_THREADS": "1"}
    item_bytes = args.item_kb * 1024
    with VirtualNetwork(2, rate_mbit=mbit or None, prefix="cdlbpt") as net:
        srv_host, cli_host = net.hosts
        server = srv_host.popen(
            [sys.executable, str(tmp / "server.py"), transport, srv_host.ip, str(args.items), str(item_bytes)],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        port, pid = map(int, server.stdout.readline().split())
        client = cli_host.popen(
            [sys.executable, str(tmp / "client.py"), transport, srv_host.ip, str(port), str(args.items),
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
    print("| link | transport | items/s | MB/s | client CPU s / 1000 items | server CPU s / 1000 items |")
    print("|---|---|---|---|---|---|")
    for mbit in args.mbit:
        link = f"{mbit:.0f} Mbit/s" if mbit else "unthrottled"
        runs: dict[str, list[dict]] = {"tcp": [], "redis": []}
        for rep in range(args.reps):  # the transports alternate, in flipped order every other rep (drift)
            for transport in ("tcp", "redis") if rep % 2 == 0 else ("redis", "tcp"):
                with tempfile.TemporaryDirectory() as tmp:
                    runs[transport].append(run_once(args, transport, mbit, Path(tmp)))
        for transport in ("tcp", "redis"):
            med = _median(runs[transport])
            results[f"{link}/{transport}"] = med
            print(f"| {link} | {transport} | {med['items_s']:.0f} | {med['mb_s']:.0f} | "
                  f"{med['client_cpu_ms_per_item']:.3f} | {med['server_cpu_ms_per_item']:.3f} |", flush=True)  # fmt: skip
        t, r = results[f"{link}/tcp"], results[f"{link}/redis"]
        print(f"| {link} | redis / tcp | {r['items_s'] / t['items_s']:.2f}x | {r['mb_s'] / t['mb_s']:.2f}x | "
              f"{r['client_cpu_ms_per_item'] / t['client_cpu_ms_per_item']:.2f}x | "
              f"{r['server_cpu_ms_per_item'] / t['server_cpu_ms_per_item']:.2f}x |", flush=True)  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

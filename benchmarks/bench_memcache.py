"""memcache benchmark: raw store throughput for 150 KB values, and epoch-2+ loader throughput.

    .venv/bin/python benchmarks/bench_memcache.py                # full run (~3 min on 2 cores)
    .venv/bin/python benchmarks/bench_memcache.py --quick        # smoke run

Part 1 (raw store): get_many of 224x224x3 uint8 arrays (150,528 bytes) in batches of 64, against
``memcpy`` bandwidth measured in the same run and against a plain redis-py MGET loop (the baseline a
user would otherwise write). An LMDB-on-/dev/shm engine is measured too when the ``lmdb`` package is
importable (it is not a dependency: ``pip install --target /tmp/x lmdb; PYTHONPATH=/tmp/x``).

Part 2 (loader): coordl.DataLoader over the synthetic ImageFolder with the standard training
transform, 2 workers: no sample cache vs LocalStore vs RedisStore on 3 local servers. One warm-up
epoch fills the caches (and the page cache, for every configuration); then timed epochs run round-
robin over the configurations so background load hits them alike. CPU-seconds per sample count the
loader process, its workers and the Redis servers. Medians over epochs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memcache import KeySpace, LocalStore  # noqa: E402
from memcache.codec import decode, encode  # noqa: E402

VALUE_SHAPE = (224, 224, 3)
BATCH = 64


def _rate(fn, nbytes: int, repeats: int) -> float:
    """Median GB/s of ``fn`` (which moves ``nbytes``) over ``repeats`` runs."""
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        rates.append(nbytes / (time.perf_counter() - t) / 1e9)
    return statistics.median(rates)


def _batches(keys: list[str]) -> list[list[str]]:
    return [keys[i : i + BATCH] for i in range(0, len(keys), BATCH)]


def raw_store(n_values: int, repeats: int, servers: list) -> list[tuple[str, float]]:
    rng = np.random.default_rng(0)
    ks = KeySpace("bench", "raw150k")
    keys = ks.keys(list(range(n_values)))
    arrays = {k: rng.integers(0, 256, VALUE_SHAPE, dtype=np.uint8) for k in keys}
    nbytes = n_values * int(np.prod(VALUE_SHAPE))
    rows: list[tuple[str, float]] = []

    src = list(arrays.values())
    dst = [np.empty_like(a) for a in src]

    def memcpy() -> None:
        for s, d in zip(src, dst, strict=True):
            np.copyto(d, s)

    rows.append(("memcpy into reused buffers (np.copyto)", _rate(memcpy, nbytes, repeats)))

    def copy_fresh() -> None:
        kept = [s.copy() for s in src]  # kept, like a get_many result: fresh pages every time
        assert len(kept) == len(src)

    rows.append(("memcpy into fresh arrays (a.copy(), kept)", _rate(copy_fresh, nbytes, repeats)))

    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        local = LocalStore(n_values * 200_000 + (64 << 20), name="bench_raw", directory=shm)
        t = time.perf_counter()
        local.put_many(arrays)
        put_local = nbytes / (time.perf_counter() - t) / 1e9

        def local_get() -> None:
            for b in _batches(keys):
                assert len(local.get_many(b)) == len(b)

        rows.append(("LocalStore.get_many (checked + copied)", _rate(local_get, nbytes, repeats)))

        def local_view() -> None:
            for b in _batches(keys):
                assert len(local.get_many(b, copy=False)) == len(b)

        rows.append(("LocalStore.get_many(copy=False) (checked)", _rate(local_view, nbytes, repeats)))
        local.verify = False

        def local_noverify() -> None:
            for b in _batches(keys):
                assert len(local.get_many(b)) == len(b)

        rows.append(("LocalStore(verify=False).get_many (copied)", _rate(local_noverify, nbytes, repeats)))
        rows.append(("LocalStore.put_many (one pass)", put_local))
        local.close()

        try:
            import lmdb
        except ImportError:
            lmdb = None
        if lmdb is not None:
            env = lmdb.open(os.path.join(shm, "lmdb"), map_size=n_values * 200_000 + (64 << 20), lock=True)
            with env.begin(write=True) as txn:
                for k, a in arrays.items():
                    txn.put(k.encode(), encode(k, a))

            def lmdb_get() -> None:
                for b in _batches(keys):
                    with env.begin(buffers=True) as txn:
                        out = {k: decode(k, txn.get(k.encode())) for k in b}
                    assert len(out) == len(b)

            rows.append(("LMDB on /dev/shm, get + same check", _rate(lmdb_get, nbytes, repeats)))
            env.close()

    if not servers:
        return rows
    import redis

    from memcache import RedisStore

    first = servers[0]
    plain = redis.Redis(host=first.host, port=first.port)
    plain.flushall()
    pipe = plain.pipeline(transaction=False)
    for k, a in arrays.items():
        pipe.set(k, a.tobytes())
    pipe.execute()

    def mget_loop() -> None:
        for b in _batches(keys):
            assert all(v is not None for v in plain.mget(b))

    rows.append(("baseline: redis-py MGET loop, 1 server, raw", _rate(mget_loop, nbytes, repeats)))
    plain.flushall()

    store = RedisStore([s.address for s in servers])
    t = time.perf_counter()
    store.put_many(arrays)
    put_redis = nbytes / (time.perf_counter() - t) / 1e9

    def redis_get() -> None:
        for b in _batches(keys):
            assert len(store.get_many(b)) == len(b)

    rows.append((f"RedisStore.get_many, {len(servers)} servers, checked", _rate(redis_get, nbytes, repeats)))
    rows.append((f"RedisStore.put_many, {len(servers)} servers", put_redis))
    store.close()
    for s in servers:
        redis.Redis(host=s.host, port=s.port).flushall()
    return rows


def _cpu_s(extra_pids: list[int]) -> float:
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    for pid in extra_pids:
        c = psutil.Process(pid).cpu_times()
        total += c.user + c.system
    return total


def loader(root: Path, epochs: int, servers: list, num_workers: int) -> dict[str, dict[str, float]]:
    import coordl
    from coordl.prep.transforms import train_transform
    from memcache import RedisStore

    ds = coordl.ImageFolder(
        root, transform=train_transform(224, recipe="resize_first")
    )  # cache decode+resize
    n = len(ds)
    server_pids = [s.pid for s in servers]
    shm = tempfile.mkdtemp(dir="/dev/shm", prefix="mc-bench-")
    stores = {
        "no sample cache": None,
        "LocalStore": LocalStore(n * 400_000 + (64 << 20), name="bench_loader", directory=shm),
        f"RedisStore ({len(servers)} servers)": RedisStore([s.address for s in servers]),
    }
    loaders = {
        name: coordl.DataLoader(ds, batch_size=32, shuffle=True, num_workers=num_workers, sample_cache=st)
        for name, st in stores.items()
    }
    results: dict[str, dict[str, list[float]]] = {name: {"rate": [], "cpu": []} for name in loaders}
    for dl in loaders.values():  # warm-up: fills the stores and the page cache
        for _ in dl:
            pass
    for _ in range(epochs):
        for name, dl in loaders.items():
            dl.reset_stats()
            cpu0, t0 = _cpu_s(server_pids), time.perf_counter()
            for _ in dl:
                pass
            wall, cpu = time.perf_counter() - t0, _cpu_s(server_pids) - cpu0
            st = dl.stats()
            if stores[name] is not None:
                assert st["sample_cache_hits"] == n, (name, st)
            results[name]["rate"].append(n / wall)
            results[name]["cpu"].append(cpu / n)
    for dl in loaders.values():
        dl.close()
    stores["LocalStore"].close()
    os.rmdir(shm)
    return {k: {m: statistics.median(v) for m, v in r.items()} for k, r in results.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    p.add_argument("--values", type=int, default=512, help="distinct 150 KB values in part 1")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--images", type=int, default=384, help="synthetic images in part 2")
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per configuration in part 2")
    p.add_argument("--raw-only", action="store_true", help="part 1 only")
    p.add_argument("--no-redis", action="store_true", help="skip the Redis rows (no redis-server here)")
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "coordl-bench-synth"))
    args = p.parse_args()
    if args.quick:
        args.values, args.repeats, args.images, args.epochs = 128, 2, 64, 1

    servers = []
    if not args.no_redis:
        from memcache.server import start_redis

        servers = [start_redis(1 << 30) for _ in range(3)]
    try:
        print(f"# memcache raw store: {args.values} values of {VALUE_SHAPE} uint8, batches of {BATCH}")
        rows = raw_store(args.values, args.repeats, servers)
        memcpy_rate = rows[0][1]
        base = next((r for name, r in rows if name.startswith("baseline")), float("nan"))
        print(f"{'operation':48s} {'GB/s':>7s} {'x memcpy':>9s} {'x redis MGET':>13s}")
        for name, rate in rows:
            print(f"{name:48s} {rate:7.2f} {rate / memcpy_rate:9.3f} {rate / base:13.2f}")
        if args.raw_only or not servers:
            return 0

        from coordl.datasets.synth import make_dataset

        root = make_dataset(f"{args.data}-{args.images}", n=args.images, classes=10, workers=1)
        print(f"\n# loader: {args.images} synthetic 500x375 JPEGs, train_transform(224), 2 workers, epoch 2+")
        res = loader(root, args.epochs, servers, num_workers=2)
        none = res["no sample cache"]
        print(
            f"{'configuration':28s} {'samples/s':>10s} {'x none':>7s} {'CPU ms/sample':>14s} {'x none':>7s}"
        )
        for name, r in res.items():
            print(
                f"{name:28s} {r['rate']:10.1f} {r['rate'] / none['rate']:7.2f} "
                f"{1000 * r['cpu']:14.2f} {r['cpu'] / none['cpu']:7.2f}"
            )
    finally:
        for s in servers:
            s.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

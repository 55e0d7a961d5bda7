"""Training from a bucket behind a far, slow link: torch over s3fs, LitData, Mosaic Streaming vs coordl.

    sudo .venv/bin/python benchmarks/bench_objectstore.py                 # 2,000 JPEGs, 3 epochs (about 10 min)
    sudo .venv/bin/python benchmarks/bench_objectstore.py --quick         # 400 smaller JPEGs, 2 epochs

The same synthetic JPEGs (``coordl synth``) sit in one bucket of a local S3 server (moto, tests/support/s3server.py)
in a network namespace behind a ``tc tbf`` link (``--rate``, default 100mbit) and a delay proxy (``--rtt-ms``,
default 20 ms round trip; this kernel has no netem), as loose files, as coordl tar shards, as Mosaic MDS shards and
as LitData chunks (shards of ``--shard-mb``, written from one shuffled order). Each loader reads ``--epochs``
epochs with 2 workers, batch 32, shuffled, the same cheap prep (decode, 64x64 centre crop), so the link decides:

* ``torch+s3fs``: what a user writes today, a map-style Dataset doing ``s3fs.cat_file`` per item;
* ``litdata``: LitData's StreamingDataset, its local cache limited to half the dataset's bytes;
* ``mosaic``: Mosaic Streaming's StreamingDataset, ``cache_limit`` half the dataset's bytes;
* ``coordl``: ``coordl.ImageFolder("s3://...")`` + ``coordl.DataLoader(cache_bytes=half)`` (MinIO cache);
* ``coordl-tar``: ``coordl.TarShards("s3://...")`` + ``coordl.ShardSampler``, whole shards staged into /dev/shm up
  to half the dataset's bytes (the same memory), the others streamed whole.

Requests and bytes per epoch are counted on the wire by the delay proxy (every loader, the same way). Request cost
uses S3 Standard's public price for GET: $0.0004 per 1,000 requests (us-east-1). Mosaic Streaming and LitData run
from ``--peers-python`` (a separate venv: installing them into the project's would downgrade numpy and pull a CUDA
torchvision); without it they are skipped. Make it with::

    python -m venv /tmp/peers && echo torch==2.13.0 > /tmp/c.txt
    /tmp/peers/bin/pip install -c /tmp/c.txt torch==2.13.0 mosaicml-streaming litdata boto3 simplejpeg
    /tmp/peers/bin/pip uninstall -y obstore     # LitData's obstore path cannot reach a plain-HTTP endpoint

See reports/bench_objectstore.md. Needs root (namespace, tc).

Why this module is long: one script builds four formats of one dataset, a server, and five loaders.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GET_PRICE_PER_1000 = 0.0004  # USD, S3 Standard GET/SELECT, us-east-1 public price list
BUCKET = "bench"
CONFIGS = ("torch+s3fs", "litdata", "mosaic", "coordl", "coordl-tar")
# also runnable with --configs: coordl-tar without fetching shards ahead (what the previous version did)
EXTRA_CONFIGS = ("coordl-tar-noahead",)
PEERS = ("litdata", "mosaic")
CROP = 64


# -- what every loader's workers run (stdlib + numpy/torch/simplejpeg: importable in both venvs) ----------------


def prep(raw: bytes):
    """Decode and take a 64x64 centre crop: the same cheap prep for every loader."""
    import numpy as np
    import simplejpeg
    import torch

    arr = simplejpeg.decode_jpeg(bytes(raw), fastdct=True, fastupsample=True)
    y, x = (arr.shape[0] - CROP) // 2, (arr.shape[1] - CROP) // 2
    return torch.from_numpy(np.ascontiguousarray(arr[y : y + CROP, x : x + CROP]))


def _wire() -> dict:
    """The delay proxy's request/byte counts (it flushes every 20 ms; wait for the last chunk), and the CPU seconds
    the server and the proxy have used so far (they share the loaders' cores on this machine)."""
    time.sleep(0.15)
    with open(os.environ["BENCH_PROXY_STATS"]) as f:
        out = json.load(f)
    out["server_cpu"] = sum(
        _cpu_seconds(int(p)) for p in os.environ.get("BENCH_SERVER_PIDS", "").split(",") if p
    )
    return out


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of one process, from /proc (stdlib only: this runs in both venvs)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _epochs(loader, epochs: int, count) -> None:
    """Iterate ``epochs`` times; one JSON line per epoch on stdout."""
    for epoch in range(1, epochs + 1):
        w0 = _wire()
        t0 = time.perf_counter()
        n = sum(count(b) for b in loader)
        seconds = time.perf_counter() - t0
        w1 = _wire()
        print(json.dumps({"epoch": epoch, "seconds": seconds, "samples": n,
                          "requests": w1["requests"] - w0["requests"], "bytes": w1["bytes"] - w0["bytes"],
                          "server_cpu": w1["server_cpu"] - w0["server_cpu"]}), flush=True)  # fmt: skip


class _S3fsFiles:
    """What a user writes today: a map-style Dataset over s3fs (one client per worker process)."""

    def __init__(self, keys: list[str], labels: list[int], opts: dict) -> None:
        self.keys, self.labels, self.opts, self.fs, self.pid = keys, labels, opts, None, -1

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int):
        if self.pid != os.getpid():
            import s3fs

            self.fs, self.pid = s3fs.S3FileSystem(skip_instance_cache=True, **self.opts), os.getpid()
        return prep(self.fs.cat_file(self.keys[i])), self.labels[i]


def _child(cfg: dict) -> None:
    import torch

    env, epochs, half = cfg["env"], cfg["epochs"], cfg["half_bytes"]
    opts = {"endpoint_url": env["AWS_ENDPOINT_URL"], "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"], "region_name": "us-east-1"}  # fmt: skip
    kw = {"batch_size": 32, "num_workers": 2}
    name = cfg["name"]
    if name == "torch+s3fs":
        import s3fs

        fs = s3fs.S3FileSystem(key=opts["aws_access_key_id"], secret=opts["aws_secret_access_key"],
                               client_kwargs={"endpoint_url": opts["endpoint_url"]})  # fmt: skip
        keys = sorted(fs.find(f"{BUCKET}/images"))
        labels = [int(k.split("/")[-2].split("_")[1]) for k in keys]
        ds = _S3fsFiles(keys, labels, {"key": opts["aws_access_key_id"], "secret": opts["aws_secret_access_key"],
                                       "client_kwargs": {"endpoint_url": opts["endpoint_url"]}})  # fmt: skip
        _epochs(torch.utils.data.DataLoader(ds, shuffle=True, **kw), epochs, lambda b: len(b[1]))
    elif name == "coordl":
        import coordl

        ds = coordl.ImageFolder(f"s3://{BUCKET}/images", transform=prep, storage_options=opts)
        with coordl.DataLoader(ds, shuffle=True, cache_bytes=half, **kw) as loader:
            _epochs(loader, epochs, lambda b: len(b[1]))
    elif name in ("coordl-tar", "coordl-tar-noahead"):
        import coordl

        stage = tempfile.mkdtemp(prefix=cfg["shm_prefix"], dir="/dev/shm")
        try:
            ahead = {"read_ahead_bytes": 0} if name.endswith("noahead") else {}  # default: two shards
            ds = coordl.TarShards(f"s3://{BUCKET}/shards", transform=prep, storage_options=opts,
                                  stage_dir=stage, stage_budget_bytes=half, memory_shards=4, **ahead)  # fmt: skip
            sampler = coordl.ShardSampler(ds, window=2, seed=0, batch_size=kw["batch_size"],
                                          num_workers=kw["num_workers"])  # fmt: skip
            with coordl.DataLoader(ds, sampler=sampler, **kw) as loader:
                _epochs(loader, epochs, lambda b: len(b[1]))
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    elif name == "litdata":
        import litdata

        class Items(litdata.StreamingDataset):
            def __getitem__(self, index):
                item = super().__getitem__(index)
                return prep(item["jpg"]), item["cls"]

        cache = tempfile.mkdtemp(prefix="litdata-", dir=cfg["work"])
        try:
            ds = Items(f"s3://{BUCKET}/litdata", cache_dir=cache, max_cache_size=half, shuffle=True, seed=0,
                       storage_options={"endpoint_url": opts["endpoint_url"]})  # fmt: skip
            _epochs(litdata.StreamingDataLoader(ds, **kw), epochs, lambda b: len(b[1]))
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    elif name == "mosaic":
        from streaming import StreamingDataset

        class Items(StreamingDataset):
            def __getitem__(self, index):
                item = super().__getitem__(index)
                return prep(item["jpg"]), item["cls"]

        cache = tempfile.mkdtemp(prefix="mosaic-", dir=cfg["work"])
        try:
            # shuffle within blocks of two shards' samples (as coordl.ShardSampler(window=2)): with one block
            # over the whole dataset (the default) and half of it cached, Mosaic re-downloads shards every few
            # samples (measured: 4.6 GB in one epoch of a 0.18 GB dataset)
            ds = Items(remote=f"s3://{BUCKET}/mds", local=cache, cache_limit=half, shuffle=True, shuffle_seed=0,
                       shuffle_algo="py1e", shuffle_block_size=cfg["window_samples"],
                       batch_size=kw["batch_size"])  # fmt: skip
            _epochs(torch.utils.data.DataLoader(ds, **kw), epochs, lambda b: len(b[1]))
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    else:
        raise SystemExit(f"unknown config {name!r}")


def _ld_item(item):
    path, label = item
    with open(path, "rb") as f:
        return {"jpg": f.read(), "cls": label}


def _convert(fmt: str, listing: str, out: str, shard_bytes: int) -> None:
    """Write the shuffled (path, label) list as MDS shards or LitData chunks (run in the peers venv)."""
    with open(listing) as f:
        items = [(p, int(lab)) for p, lab in json.load(f)]
    if fmt == "mds":
        from streaming import MDSWriter

        with MDSWriter(out=out, columns={"jpg": "bytes", "cls": "int"}, size_limit=shard_bytes) as w:
            for item in items:
                w.write(_ld_item(item))
    else:
        import litdata

        litdata.optimize(fn=_ld_item, inputs=items, output_dir=out, chunk_bytes=shard_bytes, num_workers=1)


# -- the parent: data, server, runs, table ------------------------------------------------------------------


def _shim_torchvision(work: Path) -> str:
    """A stand-in ``torchvision`` for Mosaic Streaming's import of ``streaming.vision`` (PyPI's torchvision is a
    CUDA build that fails to import on the CPU torch); the benchmark's data path never calls it."""
    pkg = work / "shim" / "torchvision"
    (pkg / "transforms").mkdir(parents=True, exist_ok=True)
    (pkg / "datasets").mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "datasets" / "__init__.py").write_text(
        "class VisionDataset:\n    pass\n\nclass CIFAR10:\n    pass\n"
    )
    (pkg / "transforms" / "__init__.py").write_text("")
    (pkg / "transforms" / "functional.py").write_text("def to_tensor(x):\n    raise NotImplementedError\n")
    return str(work / "shim")


def _prepare(args, work: Path) -> dict:
    sys.path.insert(0, str(ROOT))
    import coordl
    from coordl.datasets.synth import make_dataset
    from coordl.packing.pack import pack

    key = {"n": args.n, "size": args.size, "shard_mb": args.shard_mb, "peers": bool(args.peers_python)}
    done = work / "prepared.json"
    if done.exists() and json.loads(done.read_text())["key"] == key:  # --work: made by an earlier run
        return json.loads(done.read_text())["prepared"]
    w, h = (int(v) for v in args.size.split("x"))
    images = make_dataset(work / "images", n=args.n, classes=10, width=w, height=h, seed=0, workers=2)
    base = coordl.ImageFolder(images)
    order = list(range(len(base)))
    random.Random(0).shuffle(order)
    paths = [os.path.join(images, base.items[i][0]) for i in order]
    labels = [base.items[i][1] for i in order]
    shard_bytes = int(args.shard_mb * (1 << 20))
    shuffled = coordl.FileListDataset(paths, labels)
    shuffled.targets = labels  # what pack writes as each sample's .cls
    assert pack(shuffled, work / "shards", "tar", shard_mb=args.shard_mb, progress=False).ok
    listing = work / "listing.json"
    listing.write_text(json.dumps(list(zip(paths, labels, strict=True))))
    peers = {}
    if args.peers_python and os.path.exists(args.peers_python):
        env = dict(os.environ, PYTHONPATH=_shim_torchvision(work))
        for fmt, cfg in (("mds", "mosaic"), ("litdata", "litdata")):
            res = subprocess.run([args.peers_python, __file__, "--convert", fmt, str(listing), str(work / fmt),
                                  str(shard_bytes)], env=env, capture_output=True, text=True)  # fmt: skip
            peers[cfg] = res.returncode == 0
            if res.returncode:
                print(f"{cfg}: conversion failed:\n{res.stderr[-2000:]}", file=sys.stderr)
    data_bytes = sum(os.path.getsize(p) for p in paths)
    prepared = {"images": str(images), "data_bytes": data_bytes, "peers": peers, "shim": str(work / "shim"),
                "work": str(work)}  # fmt: skip
    done.write_text(json.dumps({"key": key, "prepared": prepared}))
    return prepared


def _run(name: str, args, srv, prepared: dict, stats_file: str) -> list[dict]:
    peer = name in PEERS
    env = dict(os.environ, **srv.env(), BENCH_PROXY_STATS=stats_file, S3_ENDPOINT_URL=srv.endpoint,
               BENCH_SERVER_PIDS=",".join(str(p) for p in srv.pids()))  # fmt: skip
    if peer:  # the shim for Mosaic's torchvision import; plain HTTP for LitData's obstore path (local server)
        env.update(PYTHONPATH=prepared["shim"], AWS_ALLOW_HTTP="true")
    cfg = {
        "name": name,
        "epochs": args.epochs,
        "half_bytes": prepared["data_bytes"] // 2,
        "env": srv.env(),
        "work": prepared["work"],
        "shm_prefix": f"bench-objstore-{os.getpid()}-",
        "window_samples": max(1, int(2 * args.shard_mb * (1 << 20) * args.n / prepared["data_bytes"])),
    }
    python = args.peers_python if peer else sys.executable
    proc = subprocess.Popen([python, __file__, "--child", json.dumps(cfg)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(ROOT), start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=args.run_timeout_s)
    except subprocess.TimeoutExpired:  # keep the epochs it finished; its workers go with it (own session)
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\nstopped after {args.run_timeout_s:g} s (--run-timeout-s)"
    for leftover in Path("/dev/shm").glob(cfg["shm_prefix"] + "*"):
        shutil.rmtree(leftover, ignore_errors=True)
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if proc.returncode or len(rows) != args.epochs:
        print(
            f"{name}: {len(rows)} of {args.epochs} epochs (rc {proc.returncode}):\n{err[-3000:]}",
            file=sys.stderr,
        )
    return rows


def _bound(args, data_bytes: int, epoch: int) -> float:
    """samples/s when the link does nothing but carry the bytes the epoch must fetch: all of them in epoch 1,
    the half that a 50% cache cannot hold from epoch 2 on."""
    must = data_bytes if epoch == 1 else data_bytes - data_bytes // 2
    return args.n * (args.rate_mbit * 1e6 / 8) / must


def _table(results: dict, args, data_bytes: int) -> str:
    """Medians over the runs of each loader, per epoch; rates from the median seconds."""
    d, link = data_bytes, args.rate_mbit * 1e6 / 8
    lines = [f"dataset: {args.n} JPEGs, {d / 1e6:.1f} MB; link {args.rate_mbit:g} Mbit/s, RTT {args.rtt_ms:g} ms; "
             f"cache/local budget {d / 2e6:.1f} MB (50%); medians over the runs (n = runs per loader)", "",
             "| loader | epoch | n | samples/s | bytes bound | fraction of bytes bound | link busy | requests | "
             "MB from store | GET cost (USD) | server CPU (of 2 cores) | s/epoch |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, runs in results.items():
        if not runs:
            lines.append(f"| {name} | - | 0 | did not run (see report) | | | | | | | | |")
            continue
        for e in range(args.epochs):
            rows = [r[e] for r in runs if len(r) > e]
            if not rows:
                lines.append(
                    f"| {name} | {e + 1} | 0 | not reached in {args.run_timeout_s:g} s | | | | | | | | |"
                )
                continue
            med = {k: statistics.median(r.get(k, 0) for r in rows)
                   for k in ("seconds", "samples", "requests", "bytes")}  # fmt: skip
            rate, bound = med["samples"] / med["seconds"], _bound(args, d, e + 1)
            busy = statistics.median(r["bytes"] / link / r["seconds"] for r in rows)
            cpu = statistics.median(r.get("server_cpu", 0) / r["seconds"] / 2 for r in rows)
            lines.append(
                f"| {name} | {e + 1} | {len(rows)} | {rate:.0f} | {bound:.0f} | {rate / bound:.2f} | "
                f"{busy:.0%} | {med['requests']:.0f} | {med['bytes'] / 1e6:.1f} | "
                f"{med['requests'] * GET_PRICE_PER_1000 / 1000:.5f} | {cpu:.0%} | {med['seconds']:.1f} |"
            )
    lines += ["", f"bytes bound: the link ({link / 1e6:.1f} MB/s) carrying only what the epoch must fetch: "
              f"{_bound(args, d, 1):.0f} samples/s in epoch 1 (all {d / 1e6:.1f} MB), {_bound(args, d, 2):.0f} "
              f"from epoch 2 (the uncached {(d - d // 2) / 1e6:.1f} MB); link busy: bytes on the wire / "
              "(link rate x epoch seconds)"]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--size", default="500x375", help="JPEG size WxH (default: ImageNet-like)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--rate-mbit", type=float, default=100.0)
    p.add_argument("--rtt-ms", type=float, default=20.0)
    p.add_argument("--shard-mb", type=float, default=8.0)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument(
        "--peers-python",
        default=str(ROOT / ".venv-peers" / "bin" / "python"),
        help="a venv with mosaicml-streaming and litdata (see reports/bench_objectstore.md)",
    )
    p.add_argument("--quick", action="store_true", help="400 JPEGs of 250x188, 2 epochs, 1 MB shards")
    p.add_argument("--run-timeout-s", type=float, default=600.0, help="per loader; finished epochs are kept")
    p.add_argument("--json", help="write the raw per-epoch results here")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="print one table of several runs' --json files")
    p.add_argument(
        "--work", help="keep the generated data here and reuse it in later runs (default: a temp dir)"
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--convert", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(json.loads(args.child))
        return 0
    if args.convert:
        fmt, listing, out, shard_bytes = args.convert
        _convert(fmt, listing, out, int(shard_bytes))
        return 0
    if args.merge:
        return _merge(args.merge)
    if args.quick:
        args.n, args.size, args.epochs, args.shard_mb = 400, "250x188", 2, 1.0
    if os.geteuid() != 0:
        print("needs root (a network namespace and tc)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from tests.support.s3server import S3Server

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-objstore-"))
    print(
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; uptime: "
        f"{subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}",
        flush=True,
    )
    try:
        prepared = _prepare(args, work)
        stats_file = str(work / "proxy.json")
        names = [c for c in args.configs.split(",") if c not in PEERS or prepared["peers"].get(c)]
        results: dict[str, list] = {c: [] for c in args.configs.split(",")}
        # auth=False: moto's signature checks would halve its requests per CPU second, taken from the loaders'
        # two cores here (a real store's CPU is not the client's)
        with S3Server(netns=True, rate=f"{args.rate_mbit:g}mbit", delay_ms=args.rtt_ms / 2,
                      stats_file=stats_file, auth=False) as srv:  # fmt: skip
            srv.create_bucket(BUCKET)
            for sub in ("images", "shards", "mds", "litdata"):
                if (work / sub).exists():
                    srv.upload_dir(work / sub, BUCKET, sub)
            for r in range(args.rounds):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    rows = _run(name, args, srv, prepared, stats_file)
                    if rows:
                        results[name].append(rows)
                    print(
                        f"round {r + 1} {name}: "
                        + ", ".join(f"{x['samples'] / x['seconds']:.0f}/s {x['requests']} req" for x in rows),
                        flush=True,
                    )
        print(_table(results, args, prepared["data_bytes"]))
        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), "data_bytes": prepared["data_bytes"],
                                                   "results": results}, indent=1))  # fmt: skip
        print(f"uptime after: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def _merge(paths: list[str]) -> int:
    """One table over several runs' ``--json`` files (the same data and link; loaders may differ per file)."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    args = argparse.Namespace(**docs[0]["args"])
    results: dict[str, list] = {}
    for doc in docs:
        if doc["data_bytes"] != docs[0]["data_bytes"] or doc["args"]["n"] != args.n:
            raise SystemExit(f"{paths[docs.index(doc)]}: another dataset than {paths[0]}")
        for name, runs in doc["results"].items():
            results.setdefault(name, []).extend(runs)
    print(_table(results, args, docs[0]["data_bytes"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

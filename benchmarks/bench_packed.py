"""Loose JPEG files vs an LMDB environment vs tar shards, on a throttled disk and on emulated NFS.

    sudo .venv/bin/python benchmarks/bench_packed.py [--n 1000 --rounds 3 --read-mb-s 16 --rate 100mbit]

The same images (``coordl synth``), packed by ``coordl pack``, read by ``coordl.DataLoader`` (batch 32,
2 workers, shuffled, a cheap transform so that storage decides the rate) for 2 epochs:

* **throttled disk** (``benchmarks/slowstore.py``): ext4 on a loop device read-limited by blkio, the
  run's page cache bounded to half the dataset, evicted before each run. Storage requests = the read
  I/Os the device served (``blkio.throttle.io_serviced``).
* **NFS** (``tests/support/ganesha.py``: nfs-ganesha in a network namespace behind ``tc tbf``):
  loose files read from NFS every epoch (``ImageFolder(nfs://..., stage_budget_bytes=0)``), loose files
  staged read-through (``ImageFolder(nfs://..., stage_dir=)``), tar shards staged whole
  (``TarShards(nfs://..., stage_dir=)``), and the LMDB file staged whole before epoch 1 (counted in
  epoch 1). Storage requests = libnfs calls that are one RPC each (open, getattr, read, close, readdir).
  Each configuration runs at every ``--delays-ms`` (netem delay added to the link's round trip).
  Reads ahead of prep are off for the NFS runs (``fetch_ahead=0``): libnfs contexts opened by several
  threads of one process fail with NFS4ERR_EXPIRED (see reports/bench_packed.md).

Runs alternate between configurations, starting with a different one each round; medians are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repo root, for tests.support and benchmarks.slowstore

BATCH, WORKERS, EPOCHS = 32, 2, 2
_RPC_CALLS = ("nfs_open", "nfs_fstat64", "nfs_read", "nfs_close", "nfs_opendir", "nfs_mount")


# -- child: one configuration, all epochs ---------------------------------------------------------


def _count_nfs_rpcs():
    """Wrap the libnfs calls that are one RPC each; the counters are shared with forked workers."""
    import warnings

    from shmem.counters import SharedCounters

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from libnfs import libnfs as lib
    counters = SharedCounters(["nfs_rpcs", "nfs_bytes"])
    for name in _RPC_CALLS:
        real = getattr(lib, name)

        def counted(*a, _real=real, _name=name):
            counters.add("nfs_rpcs")
            out = _real(*a)
            if _name == "nfs_read" and isinstance(out, int) and out > 0:
                counters.add("nfs_bytes", out)
            return out

        setattr(lib, name, counted)

    def read() -> tuple[int, int]:
        snap = counters.snapshot()
        return snap["nfs_rpcs"], snap["nfs_bytes"]

    return read


def _blkio_reader(cgroup: str, device: str):
    def read() -> tuple[int, int]:
        out = []
        for name in ("io_serviced", "io_service_bytes"):
            with open(f"/sys/fs/cgroup/blkio/{cgroup}/blkio.throttle.{name}") as f:
                rows = [line.split() for line in f]
            out.append(sum(int(r[2]) for r in rows if len(r) == 3 and r[0] == device and r[1] == "Read"))
        return out[0], out[1]

    return read


def _dataset(kind: str, where: str, stage: str | None):
    import coordl
    from coordl.packed.lmdb import LMDBDataset
    from coordl.packed.tar import TarShards
    from coordl.prep.transforms import eval_transform

    tf = eval_transform(64, resize=72)  # DCT-scaled decode: cheap prep, storage sets the pace
    if kind == "loose":
        return coordl.ImageFolder(where, transform=tf)
    if kind == "loose-nfs":
        return coordl.ImageFolder(where, transform=tf, stage_dir=stage, stage_budget_bytes=0)
    if kind == "loose-staged":
        return coordl.ImageFolder(where, transform=tf, stage_dir=stage)
    if kind == "tar":
        return TarShards(where, transform=tf, stage_dir=stage)
    if kind == "lmdb":
        if stage is None:
            return LMDBDataset(where, transform=tf)
        from nfs_cache import StagedSource

        with StagedSource(where, stage) as staged:  # the whole environment file, before epoch 1
            staged.read("data.mdb")
            local = os.path.dirname(staged.local_path("data.mdb"))
        return LMDBDataset(local, transform=tf)
    raise ValueError(kind)


def child(args: argparse.Namespace) -> None:
    import torch

    import coordl

    requests = _count_nfs_rpcs() if args.nfs else _blkio_reader(args.cgroup, args.device)
    t_open = time.perf_counter()
    req0 = requests()
    ds = _dataset(args.kind, args.where, args.stage)
    open_s = time.perf_counter() - t_open
    loader = coordl.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                               generator=torch.Generator().manual_seed(0), persistent_workers=True,
                               fetch_ahead=0 if args.nfs else None)  # fmt: skip
    rows = []
    for epoch in range(EPOCHS):
        t0 = time.perf_counter()
        n = sum(len(y) for _x, y in loader)
        secs = time.perf_counter() - t0 + (open_s if epoch == 0 else 0.0)  # opening/staging is epoch 1's
        req1 = requests()
        rows.append(
            {"samples_per_s": n / secs, "requests": req1[0] - req0[0], "mb": (req1[1] - req0[1]) / 1e6}
        )
        req0 = req1
    loader.close()
    print(json.dumps(rows))


# -- parent: data, stores, rounds -----------------------------------------------------------------


def make_data(work: str, n: int) -> dict[str, str]:
    from coordl.datasets.files import ImageFolder
    from coordl.datasets.synth import make_dataset
    from coordl.packing.pack import pack

    loose = str(make_dataset(os.path.join(work, "loose"), n=n, classes=10, seed=0))
    lmdb_dir, tar_dir = os.path.join(work, "lmdb"), os.path.join(work, "tar")
    assert pack(ImageFolder(loose), lmdb_dir, "lmdb", progress=False).ok
    assert pack(ImageFolder(loose), tar_dir, "tar", shard_mb=16, progress=False).ok
    os.unlink(
        os.path.join(lmdb_dir, "lock.mdb")
    )  # readers open with lock=False; staging copies data.mdb only
    return {"loose": loose, "lmdb": lmdb_dir, "tar": tar_dir}


def _du_mb(path: str) -> float:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file()) / 1e6


def _run_child(cmd: list[str], runner) -> list[dict]:
    return json.loads(runner(cmd).strip().splitlines()[-1])


def _run_plain(cmd: list[str]) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[2:5])} failed (rc {out.returncode}):\n{out.stderr[-3000:]}")
    return out.stdout


def _rounds(configs: list[str], rounds: int, run_one) -> dict[str, list[list[dict]]]:
    results: dict[str, list[list[dict]]] = {c: [] for c in configs}
    for r in range(rounds):
        order = configs[r % len(configs) :] + configs[: r % len(configs)]
        for c in order:
            results[c].append(run_one(c))
            e = results[c][-1]
            print(f"  round {r + 1} {c:>13}: " + "  ".join(f"e{i + 1} {x['samples_per_s']:.0f}/s {x['requests']} req"
                                                         for i, x in enumerate(e)), flush=True)  # fmt: skip
    return results


def bench_disk(paths: dict[str, str], args: argparse.Namespace) -> dict:
    from benchmarks.slowstore import SlowStore, copy_tree

    size = max(_du_mb(p) for p in paths.values())
    image = int(sum(_du_mb(p) for p in paths.values()) * 1.4e6) + (128 << 20)
    with SlowStore(image_bytes=image, read_bps=int(args.read_mb_s * 1e6),
                   page_cache_bytes=int(size * 0.5e6) + (8 << 20), tag="packed") as store:  # fmt: skip
        local = {}
        for kind, path in paths.items():
            local[kind] = os.path.join(store.mount, kind)
            copy_tree(path, local[kind])

        def run_one(kind: str) -> list[dict]:
            store.evict()
            cmd = [sys.executable, __file__, "--child", kind, local[kind], "--cgroup", store.name,
                   "--device", store.device]  # fmt: skip
            return _run_child(cmd, store.run)

        return _rounds(["loose", "lmdb", "tar"], args.rounds, run_one)


def _add_delay(server, delay_ms: float) -> None:
    """netem on the client's end of the veth pair: every request waits ``delay_ms`` on its way out."""
    if delay_ms > 0:
        cmd = ["tc", "qdisc", "replace", "dev", server.veth_host, "root", "netem", "delay", f"{delay_ms}ms"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
        if out.returncode != 0:  # e.g. a kernel without sch_netem (this dev VM's)
            raise RuntimeError(f"cannot add {delay_ms} ms of delay: {' '.join(cmd)}: {out.stderr.strip()}")


def bench_nfs(paths: dict[str, str], work: str, args: argparse.Namespace, delay_ms: float) -> dict:
    from tests.support.ganesha import GaneshaServer

    export = os.path.join(work, "export")
    os.makedirs(export, exist_ok=True)
    for kind, path in paths.items():
        if not os.path.exists(os.path.join(export, kind)):
            shutil.copytree(path, os.path.join(export, kind))
    n_shards = len([n for n in os.listdir(paths["tar"]) if n.endswith(".tar")])
    with GaneshaServer(export, netns=True, rate=args.rate, tag="pkb") as server:
        _add_delay(server, delay_ms)
        where = {
            "loose-nfs": server.url("loose"),
            "loose-staged": server.url("loose"),
            "lmdb": server.url("lmdb"),
            "tar": server.url("tar").replace("/tar?", f"/tar/data-{{000000..{n_shards - 1:06d}}}.tar?"),
        }

        def run_one(kind: str) -> list[dict]:
            stage = tempfile.mkdtemp(prefix="stage-", dir=work)
            try:
                cmd = [sys.executable, __file__, "--child", kind, where[kind], "--nfs", "--stage", stage]
                return _run_child(cmd, _run_plain)
            finally:
                shutil.rmtree(stage)

        return _rounds(list(where), args.rounds, run_one)


def _table(title: str, results: dict, base: str) -> None:
    def med(c: str, e: int, key: str) -> float:
        return statistics.median(run[e][key] for run in results[c])

    print(f"\n{title}")
    print(
        f"| source | epoch 1 samples/s | vs {base} | steady samples/s | vs {base} | requests e1 | requests e2 |"
    )
    print("|---|---|---|---|---|---|---|")
    for c in results:
        e1, e2 = med(c, 0, "samples_per_s"), med(c, 1, "samples_per_s")
        b1, b2 = med(base, 0, "samples_per_s"), med(base, 1, "samples_per_s")
        print(f"| {c} | {e1:.0f} | {e1 / b1:.2f}x | {e2:.0f} | {e2 / b2:.2f}x | "
              f"{med(c, 0, 'requests'):.0f} | {med(c, 1, 'requests'):.0f} | "
              f"{med(c, 0, 'mb'):.1f} | {med(c, 1, 'mb'):.1f} |")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=1000, help="images (500x375 JPEG, ~90 KB each)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--read-mb-s", type=float, default=16.0, help="throttled disk read rate")
    parser.add_argument("--rate", default="100mbit", help="tc tbf rate of the NFS link")
    parser.add_argument("--delays-ms", default="0",
                        help="NFS runs at each of these added round-trip delays, e.g. 0,2 (needs the netem qdisc)")  # fmt: skip
    parser.add_argument("--only", choices=("disk", "nfs"), default=None)
    parser.add_argument("--child", nargs=2, metavar=("KIND", "WHERE"), help=argparse.SUPPRESS)
    parser.add_argument("--cgroup", help=argparse.SUPPRESS)
    parser.add_argument("--device", help=argparse.SUPPRESS)
    parser.add_argument("--stage", help=argparse.SUPPRESS)
    parser.add_argument("--nfs", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.kind, args.where = args.child
        child(args)
        return 0
    if os.geteuid() != 0:
        print("bench_packed: needs root (loop device, cgroups, network namespace)", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="bench-packed-", dir="/var/tmp")
    try:
        paths = make_data(work, args.n)
        print("sizes (MB): " + ", ".join(f"{k} {_du_mb(p):.1f}" for k, p in paths.items()), flush=True)
        if args.only in (None, "disk"):
            print(
                f"throttled disk: {args.read_mb_s} MB/s, page cache bounded to half the dataset", flush=True
            )
            _table(f"Throttled disk ({args.read_mb_s:g} MB/s)", bench_disk(paths, args), "loose")
        for delay_ms in [float(d) for d in args.delays_ms.split(",")] if args.only in (None, "nfs") else []:
            print(f"NFS: nfs-ganesha behind tc tbf {args.rate}, +{delay_ms:g} ms round trip", flush=True)
            title = f"NFS ({args.rate}, +{delay_ms:g} ms round trip)"
            _table(title, bench_nfs(paths, work, args, delay_ms), "loose-nfs")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

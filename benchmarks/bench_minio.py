"""MinIO cache vs the OS page cache under the same memory limit, random access, 3 epochs.

    sudo .venv/bin/python benchmarks/bench_minio.py            # ~4 min on a 2-core VM

The baseline a user would otherwise pick is ``torch.utils.data.DataLoader`` reading files and
relying on the OS page cache. Both loaders run (one after the other, same data, same shuffled order
per seed, 2 workers) in a child process confined to one cgroup-v1 memory limit (dataset x cached
fraction + the process overhead) whose disk reads are throttled (a slow disk: the regime a data cache
is for). Bytes read from the disk come from the cgroup's blkio counters, so page-cache misses are
counted the same way for both. Needs root (cgroups v1 ``memory`` and ``blkio``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CG = "/sys/fs/cgroup"
MiB = 1 << 20


# -- child: one loader, several epochs, inside the cgroup ----------------------------------------


class FileItems:
    """Files ``<root>/<i>.bin``; prep keeps 16 bytes (fetch-bound on purpose: it is what a cache helps)."""

    def __init__(self, root: str) -> None:
        self.paths = sorted(Path(root).glob("*.bin"), key=lambda p: int(p.stem))

    def __len__(self) -> int:
        return len(self.paths)

    def fetch(self, index: int) -> bytes:
        with open(self.paths[index], "rb") as f:
            return f.read()

    def prep(self, raw: bytes, index: int):
        import torch

        return torch.frombuffer(bytearray(raw[:16]), dtype=torch.uint8)

    def __getitem__(self, index: int):  # the torch baseline's path: fetch + prep in one call
        return self.prep(self.fetch(index), index)


def blkio_read_bytes(cgroup: str) -> int:
    total = 0
    with open(f"{CG}/blkio/{cgroup}/blkio.throttle.io_service_bytes") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[1] == "Read":
                total += int(parts[2])
    return total


def child(args: argparse.Namespace) -> None:
    import torch

    import coordl

    src = FileItems(args.root)
    kwargs = dict(
        batch_size=32, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(args.seed)
    )
    if args.child == "torch":
        loader = torch.utils.data.DataLoader(src, persistent_workers=True, **kwargs)
    else:
        loader = coordl.DataLoader(src, persistent_workers=True, cache_bytes=args.cache_mib * MiB, **kwargs)
    epochs = []
    for _ in range(args.epochs):
        read0, t0 = blkio_read_bytes(args.cgroup), time.perf_counter()
        n = sum(len(b) for b in loader)
        epochs.append(
            {
                "time_s": time.perf_counter() - t0,
                "disk_bytes": blkio_read_bytes(args.cgroup) - read0,
                "items": n,
            }
        )
    extra = loader.stats() if args.child == "coordl" else {}
    with open(f"{CG}/memory/{args.cgroup}/memory.max_usage_in_bytes") as f:
        peak = int(f.read())
    print(json.dumps({"epochs": epochs, "stats": extra, "peak_bytes": peak}))
    if hasattr(loader, "close"):
        loader.close()


# -- parent: data, cgroups, runs, table ------------------------------------------------------------


def make_data(root: Path, n: int, item_bytes: int) -> None:
    if root.exists() and len(list(root.glob("*.bin"))) == n:
        return
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (root / f"{i}.bin").write_bytes(os.urandom(item_bytes))


def evict(root: Path) -> None:
    os.sync()  # dirty pages cannot be dropped: write them back first
    for p in root.glob("*.bin"):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def setup_cgroup(name: str, limit_bytes: int, dev: str, read_bps: int) -> None:
    for ctl in ("memory", "blkio"):
        os.makedirs(f"{CG}/{ctl}/{name}", exist_ok=True)
    Path(f"{CG}/memory/{name}/memory.limit_in_bytes").write_text(str(limit_bytes))
    Path(f"{CG}/blkio/{name}/blkio.throttle.read_bps_device").write_text(f"{dev} {read_bps}")


def remove_cgroup(name: str) -> None:
    for ctl in ("memory", "blkio"):
        path = f"{CG}/{ctl}/{name}"
        if os.path.isdir(path):
            try:
                os.rmdir(path)
            except OSError as e:
                print(f"warning: could not remove {path}: {e}", file=sys.stderr)


def run_child(mode: str, args: argparse.Namespace, cgroup: str, seed: int) -> dict:
    # Fresh limits and counters for every run: force_empty drops the last run's page-cache charge.
    Path(f"{CG}/memory/{cgroup}/memory.force_empty").write_text("0")
    Path(f"{CG}/memory/{cgroup}/memory.max_usage_in_bytes").write_text("0")
    cmd = [sys.executable, __file__, "--child", mode, "--root", str(args.root), "--cgroup", cgroup]
    cmd += ["--epochs", str(args.epochs), "--seed", str(seed), "--cache-mib", str(args.cache_mib)]

    def enter_cgroup() -> None:
        for ctl in ("memory", "blkio"):
            Path(f"{CG}/{ctl}/{cgroup}/cgroup.procs").write_text(str(os.getpid()))

    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, preexec_fn=enter_cgroup)
    if out.returncode != 0:
        raise RuntimeError(f"{mode} run failed (rc {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", choices=["torch", "coordl"])
    p.add_argument("--root", type=Path, default=Path("/var/tmp/coordl-bench-minio"))
    p.add_argument("--cgroup", default=f"ldr-bench-{os.getpid()}")
    p.add_argument("--items", type=int, default=2048)
    p.add_argument("--item-kib", type=int, default=256)
    p.add_argument("--cached-fraction", type=float, default=0.5)
    p.add_argument("--overhead-mib", type=int, default=250, help="memory for the processes themselves")
    p.add_argument("--read-mb-per-s", type=int, default=200, help="disk read throttle")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-mib", type=int, default=0)
    p.add_argument("--json", type=Path, help="also write the raw results here")
    args = p.parse_args()
    if args.child:
        child(args)
        return
    dataset_mib = args.items * args.item_kib // 1024
    args.cache_mib = int(dataset_mib * args.cached_fraction)
    limit = (args.cache_mib + args.overhead_mib) * MiB
    st = os.stat(args.root.parent if not args.root.exists() else args.root)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    make_data(args.root, args.items, args.item_kib * 1024)
    setup_cgroup(args.cgroup, limit, dev, args.read_mb_per_s * 1000 * 1000)
    results: dict[str, list[dict]] = {"torch": [], "coordl": []}
    try:
        for run in range(args.runs):
            for mode in ("torch", "coordl"):
                evict(args.root)
                results[mode].append(run_child(mode, args, args.cgroup, seed=args.seed + run))
                print(
                    f"run {run} {mode}: {[round(e['time_s'], 1) for e in results[mode][-1]['epochs']]} s",
                    flush=True,
                )
    finally:
        remove_cgroup(args.cgroup)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print_table(args, dataset_mib, limit, results)


def print_table(args: argparse.Namespace, dataset_mib: int, limit: int, results: dict) -> None:
    total = args.items * args.item_kib * 1024
    print(
        f"\n{args.items} items x {args.item_kib} KiB = {dataset_mib} MiB; memory limit {limit // MiB} MiB "
        f"(MinIO cache_bytes {args.cache_mib} MiB = {args.cached_fraction:.0%}); disk {args.read_mb_per_s} MB/s; "
        f"2 workers, shuffle; median of {args.runs} runs"
    )
    print(f"{'epoch':>5} | {'torch+page cache':>28} | {'coordl MinIO':>28} | {'speed-up':>8}")
    print(
        f"{'':>5} | {'hit ratio':>10} {'time s':>8} {'disk MiB':>8} | {'hit ratio':>10} {'time s':>8} {'disk MiB':>8} |"
    )
    for e in range(args.epochs):
        row = []
        for mode in ("torch", "coordl"):
            disk = statistics.median(r["epochs"][e]["disk_bytes"] for r in results[mode])
            t = statistics.median(r["epochs"][e]["time_s"] for r in results[mode])
            row.append((max(0.0, 1 - disk / total), t, disk / MiB))
        ratio = row[0][1] / row[1][1] if row[1][1] else float("nan")
        print(
            f"{e + 1:>5} | {row[0][0]:>10.2f} {row[0][1]:>8.1f} {row[0][2]:>8.0f} | "
            f"{row[1][0]:>10.2f} {row[1][1]:>8.1f} {row[1][2]:>8.0f} | {ratio:>7.2f}x"
        )
    peaks = {m: max(r["peak_bytes"] for r in results[m]) // MiB for m in results}
    print(
        f"peak cgroup memory: torch {peaks['torch']} MiB, coordl {peaks['coordl']} MiB (limit {limit // MiB})"
    )
    print("hit ratio = 1 - disk bytes read / dataset bytes (page-cache or MinIO hits)")


if __name__ == "__main__":
    main()

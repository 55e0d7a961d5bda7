"""coordl.dali.DALILoader against DALI's own file reader, coordl.DataLoader and torch's DataLoader.

    sudo .venv/bin/python benchmarks/bench_dali.py                 # CPU, ~10 min on the 2-core VM
    sudo .venv/bin/python benchmarks/bench_dali.py --device gpu    # DALI configs on the GPU
    sudo .venv/bin/python benchmarks/bench_dali.py --runs 1 --n 500 # quick look

Same synthetic ImageFolder as ``bench_loader.py`` (500x375 JPEGs of ~90 KB), shuffled, 3 epochs per
run, each loader in a fresh child process; configurations alternate within each of ``--runs``
rounds and tables show medians.

(1) Prep-bound, fully cached. The files sit in the page cache (read once before the runs); rates
    are taken over epochs 2..3 (epoch 1 fills coordl's caches and warms DALI):
      * ``dali``: DALI alone: ``fn.readers.file`` -> the same prep graph as the DALILoader
        (``coordl.dali.train_pipeline(224)``: decode + random-resized-crop, flip, normalize) ->
        ``DALIGenericIterator``;
      * ``dali_loader``: ``coordl.dali.DALILoader`` with ``cache_bytes`` = the whole dataset (every
        item from the MinIO cache from epoch 2 on) and the same prep graph;
      * ``coordl``: ``coordl.DataLoader`` on the CPU (simplejpeg + torch transforms), cache 100%,
        ``num_workers`` = cores;
      * ``torch``: ``torch.utils.data.DataLoader`` over a Pillow ImageFolder (``bench_loader.PillowFolder``),
        ``num_workers`` = cores.
    Target: the cache costs nothing, DALILoader >= 95% of DALI alone. On a loaded machine the wall
    rates drift, so CPU seconds per sample (this process and all its children) are reported too.

(2) Fetch-bound: the dataset on a throttled loop device (``benchmarks/slowstore.py``, ``--read-mb-s``)
    with a bounded page cache (``--cache-fraction`` of the dataset, 50%):
      * ``dali``: DALI's file reader, the page cache may hold 50% of the dataset;
      * ``dali_loader``: DALILoader with MinIO at 50%; its page cache bound is the budget minus its
        cache (zero), as ``bench_loader.py`` does for ``coordl.DataLoader``.
    Storage bytes come from the loop device's blkio counter. The *bytes bound* of an epoch is the
    rate storage alone allows: ``read_bps * items / storage bytes read``; target: DALILoader at it.

(3) Two jobs at once (``--coordinated``), page-cached files: two DALI-alone jobs side by side against
    two ``DALILoader(coordinate=Group(...))`` jobs, which fetch each batch's raw bytes once for both
    and each prep it on its own pipeline. Reported: the jobs' combined samples/s, the items each
    pair read from storage per item delivered (DALI alone 1.0; a coordinated pair 0.5 plus what
    the producers fetched ahead), CPU ms per sample.

``--photos``: part (1) also on the photographic dataset of ``--n`` files (``coordl synth --photos``), every
run alternating it with the synthetic one; a table per dataset.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_loader  # noqa: E402  (its PillowFolder, CPU accounting and blkio reader)

CONFIGS = {
    "dali": "DALI alone (file reader)",
    "dali_loader": "coordl.dali.DALILoader",
    "coordl": "coordl.DataLoader (CPU prep)",
    "torch": "torch DataLoader + Pillow",
}
CROP = 224


# -- child side ------------------------------------------------------------------------------------


def _dali_reader(root: str, args: argparse.Namespace, transform) -> object:
    from nvidia.dali import fn
    from nvidia.dali.pipeline import Pipeline
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    pipe = Pipeline(batch_size=args.batch_size, num_threads=args.workers, seed=args.seed,
                    device_id=0 if args.device == "gpu" else None)  # fmt: skip
    with pipe:
        # Plain read() as in bench_loader: with mmap, pages reclaimed while mapped are read again.
        jpegs, labels = fn.readers.file(
            file_root=root, random_shuffle=True, name="Reader", seed=args.seed, dont_use_mmap=True
        )
        images = transform(jpegs, args.device)
        pipe.set_outputs(images, labels.gpu() if args.device == "gpu" else labels)
    return DALIGenericIterator([pipe], ["data", "label"], reader_name="Reader",
                               last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True)  # fmt: skip


def _loader(args: argparse.Namespace) -> object:
    import torch

    import coordl
    from coordl.coordinated.job import Group
    from coordl.prep.transforms import train_transform

    gen = torch.Generator().manual_seed(args.seed)
    common = dict(batch_size=args.batch_size, shuffle=True, generator=gen)
    if args.child == "dali":
        from coordl.dali import train_pipeline

        return _dali_reader(args.root, args, train_pipeline(CROP))
    if args.child == "dali_loader":
        from coordl.dali import DALILoader, train_pipeline

        group = Group(args.coordinate, timeout_s=120) if args.coordinate else None
        return DALILoader(coordl.ImageFolder(args.root), device=args.device, cache_bytes=args.cache_bytes,
                          transform=train_pipeline(CROP), num_threads=args.workers, seed=args.seed,
                          coordinate=group, **common)  # fmt: skip
    if args.child == "coordl":
        ds = coordl.ImageFolder(args.root, train_transform(CROP, bench_loader.RESIZE))
        return coordl.DataLoader(ds, num_workers=args.workers, cache_bytes=args.cache_bytes, **common)
    return torch.utils.data.DataLoader(
        bench_loader.PillowFolder(args.root), num_workers=args.workers, **common
    )


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    loader = _loader(args)
    if args.barrier:  # the jobs of part (3) start consuming together (each a member of its group by then)
        Path(args.barrier, f"ready-{os.getpid()}").touch()
        while len(list(Path(args.barrier).glob("ready-*"))) < 2:
            time.sleep(0.01)
    gpu = args.device == "gpu" and args.child.startswith("dali")
    epochs = []
    for _ in range(args.epochs):
        read0 = bench_loader._blkio_read(args.blkio, args.dev) if args.blkio else 0
        cpu0, t0 = bench_loader._cpu_s(), time.perf_counter()
        n = 0
        for batch in loader:
            n += len(batch[0]["label"]) if args.child == "dali" else len(batch[1])
        if gpu:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        disk = bench_loader._blkio_read(args.blkio, args.dev) - read0 if args.blkio else 0
        epochs.append(
            {"time_s": elapsed, "items": n, "cpu_s": bench_loader._cpu_s() - cpu0, "disk_bytes": disk}
        )
    storage_items = None
    if hasattr(loader, "epoch_stats"):
        for e, st in zip(epochs, loader.epoch_stats(), strict=False):
            e["hit_ratio"], e["storage_bytes"] = st["hit_ratio"], st["storage_bytes_read"]
        storage_items = loader.stats()["storage_items_read"]
        loader.close()
    print(json.dumps({"epochs": epochs, "storage_items": storage_items}))


# -- parent side -----------------------------------------------------------------------------------


def _cmd(args: argparse.Namespace, cfg: str, root: str, seed: int, cache_bytes: int) -> list[str]:
    cmd = [sys.executable, __file__, "--child", cfg, "--root", root, "--seed", str(seed)]
    cmd += [
        "--epochs",
        str(args.epochs),
        "--workers",
        str(args.workers),
        "--batch-size",
        str(args.batch_size),
    ]
    return cmd + ["--cache-bytes", str(cache_bytes), "--device", args.device]


def _parse(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def prep_bound(
    args: argparse.Namespace, roots: dict[str, str], dataset_bytes: int
) -> dict[str, dict[str, list[dict]]]:
    """Part (1): every loader over a page-cached dataset, caches sized for all of it; per dataset
    (``synth``, and ``photos`` with ``--photos``), each run alternating the datasets and configs."""
    for root in roots.values():
        for f in _files(Path(root)):
            f.read_bytes()  # into the page cache
    cache = int(dataset_bytes * 1.1) + (16 << 20)
    configs = list(args.prep_configs.split(","))
    out: dict[str, dict[str, list[dict]]] = {kind: {c: [] for c in configs} for kind in roots}
    for run in range(args.runs):
        for cfg in configs[run % len(configs) :] + configs[: run % len(configs)]:
            for kind, root in roots.items():
                res = subprocess.run(_cmd(args, cfg, root, args.seed + run, cache), capture_output=True,
                                     text=True, timeout=900, check=False)  # fmt: skip
                if res.returncode:
                    raise RuntimeError(f"{cfg} on {kind} failed:\n{res.stderr[-3000:]}")
                epochs = _parse(res.stdout)["epochs"][1:]
                items, wall, cpu = (sum(e[k] for e in epochs) for k in ("items", "time_s", "cpu_s"))
                out[kind][cfg].append({"rate": items / wall, "cpu_ms": 1000 * cpu / items})
                print(f"prep-bound run {run} ({cfg}, {kind}): {items / wall:.0f}/s, "
                      f"{1000 * cpu / items:.2f} CPU ms/sample", flush=True)  # fmt: skip
    return out


def _files(root: Path) -> list[Path]:
    """The dataset's files (``.jpg`` for coordl synth, ``.JPEG`` for the photographs)."""
    return [f for f in root.glob("class_*/*") if f.is_file()]


def fetch_bound(args: argparse.Namespace, src: Path, dataset_bytes: int) -> dict[str, list[list[dict]]]:
    """Part (2): DALI's file reader vs DALILoader on throttled storage with a bounded page cache."""
    from slowstore import SlowStore, copy_tree

    budget = int(dataset_bytes * args.cache_fraction)
    configs = list(args.fetch_configs.split(","))
    out: dict[str, list[list[dict]]] = {c: [] for c in configs}
    read_bps = int(args.read_mb_s * 1e6)
    with SlowStore(int(dataset_bytes * 1.6) + (128 << 20), read_bps, page_cache_bytes=budget) as store:
        root = os.path.join(store.mount, "data")
        copy_tree(src, root)
        blkio = store.io_counter
        for run in range(args.runs):
            for cfg in configs[run % len(configs) :] + configs[: run % len(configs)]:
                cache = budget if cfg in ("dali_loader", "coordl") else 0
                store.set_page_cache_bytes(budget - cache + bench_loader.METADATA_ALLOWANCE_BYTES)
                store.evict()
                cmd = _cmd(args, cfg, root, args.seed + run, cache) + [
                    "--blkio",
                    blkio,
                    "--dev",
                    store.device,
                ]
                epochs = _parse(store.run(cmd))["epochs"]
                for e in epochs:
                    e["bound"] = read_bps * e["items"] / max(e["disk_bytes"], 1)
                out[cfg].append(epochs)
                print(f"fetch-bound run {run} ({cfg}): " + ", ".join(
                    f"{e['items'] / e['time_s']:.0f}/s (bound {e['bound']:.0f})" for e in epochs), flush=True)  # fmt: skip
    return out


def coordinated(args: argparse.Namespace, root: str) -> dict[str, list[dict]]:
    """Part (3): two jobs at once, DALI alone side by side vs a coordinated DALILoader pair."""
    import tempfile

    out: dict[str, list[dict]] = {"dali": [], "dali_loader": []}
    for run in range(args.runs):
        for cfg in ("dali", "dali_loader") if run % 2 == 0 else ("dali_loader", "dali"):
            with tempfile.TemporaryDirectory() as barrier:
                extra = ["--barrier", barrier] + (["--coordinate", f"bench-dali-{os.getpid()}-{run}"]
                                                   if cfg == "dali_loader" else [])  # fmt: skip
                # both jobs with the same seed: a group's members must agree on its order
                procs = [subprocess.Popen(_cmd(args, cfg, root, args.seed + run, 0) + extra, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]  # fmt: skip
                results = [p.communicate(timeout=900) for p in procs]
            if any(p.returncode for p in procs):
                raise RuntimeError(f"{cfg} pair failed:\n" + "\n".join(err[-2000:] for _, err in results))
            jobs = [_parse(stdout) for stdout, _ in results]
            # epochs 2.. as in part (1): the first holds the group's start (its producers' processes: ~1 s)
            items = sum(e["items"] for j in jobs for e in j["epochs"][1:])
            wall = max(sum(e["time_s"] for e in j["epochs"][1:]) for j in jobs)
            cpu = sum(e["cpu_s"] for j in jobs for e in j["epochs"][1:])
            read = [j["storage_items"] for j in jobs]  # every epoch's reads: per item of every epoch
            served = sum(e["items"] for j in jobs for e in j["epochs"])
            out[cfg].append({"rate": items / wall, "cpu_ms": 1000 * cpu / items,
                             "read_per_item": sum(read) / served if None not in read else 1.0})  # fmt: skip
            print(f"two jobs, run {run} ({cfg}): {items / wall:.0f}/s together, "
                  f"{out[cfg][-1]['read_per_item']:.2f} storage reads per item", flush=True)  # fmt: skip
    return out


def print_coordinated(res: dict[str, list[dict]], args: argparse.Namespace) -> None:
    print(
        f"\n(3) two jobs at once, device={args.device}, {args.workers} threads each, medians of {args.runs} runs"
    )
    print("| pair | samples/s together | storage reads per item | CPU ms/sample |")
    print("|---|---|---|---|")
    for cfg, runs in res.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("rate", "read_per_item", "cpu_ms")}
        print(
            f"| 2 x {CONFIGS[cfg]} | {med['rate']:.0f} | {med['read_per_item']:.2f} | {med['cpu_ms']:.2f} |"
        )


def print_prep(res: dict[str, list[dict]], args: argparse.Namespace, kind: str = "synth") -> None:
    base = res.get("dali")
    print(f"\n(1) prep-bound, {kind}, fully cached, device={args.device}, {args.workers} threads/workers, "
          f"batch {args.batch_size}, medians of {args.runs} runs (epochs 2..{args.epochs})")  # fmt: skip
    print("| loader | samples/s | vs DALI alone | CPU ms/sample | DALI's CPU / its CPU |")
    print("|---|---|---|---|---|")
    for cfg, runs in res.items():
        rate = statistics.median(r["rate"] for r in runs)
        cpu = statistics.median(r["cpu_ms"] for r in runs)
        if base:
            b_rate = statistics.median(r["rate"] for r in base)
            b_cpu = statistics.median(r["cpu_ms"] for r in base)
            vs, cpu_vs = f"{rate / b_rate:.2f}", f"{b_cpu / cpu:.2f}"
        else:
            vs = cpu_vs = "-"
        print(f"| {CONFIGS[cfg]} | {rate:.0f} | {vs} | {cpu:.2f} | {cpu_vs} |")


def print_fetch(res: dict[str, list[list[dict]]], args: argparse.Namespace, dataset_bytes: int) -> None:
    print(f"\n(2) fetch-bound: {args.read_mb_s:g} MB/s storage, {args.cache_fraction:.0%} of "
          f"{dataset_bytes / 1e6:.0f} MB cacheable, medians of {args.runs} runs")  # fmt: skip
    print("| loader | epoch | samples/s | storage MB | hit ratio | bytes bound samples/s | rate / bound |")
    print("|---|---|---|---|---|---|---|")
    for cfg, runs in res.items():
        for e in range(len(runs[0])):
            rows = [r[e] for r in runs]
            rate = statistics.median(x["items"] / x["time_s"] for x in rows)
            disk = statistics.median(x["disk_bytes"] for x in rows)
            bound = statistics.median(x["bound"] for x in rows)
            hit = statistics.median(x.get("hit_ratio", 1 - x["disk_bytes"] / dataset_bytes) for x in rows)
            print(f"| {CONFIGS[cfg]} | {e + 1} | {rate:.0f} | {disk / 1e6:.1f} | {hit:.2f} | {bound:.0f} | "
                  f"{rate / bound:.2f} |")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", choices=sorted(CONFIGS))
    p.add_argument("--root", default="")
    p.add_argument("--blkio", default="")
    p.add_argument("--dev", default="", help="(child) the slow store's major:minor")
    p.add_argument("--cache-bytes", type=int, default=0)
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu", help="where the DALI configs prep")
    p.add_argument("--n", type=int, default=1000, help="images (default 1000)")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--read-mb-s", type=float, default=8.0, help="storage read throttle, MB/s (default 8)")
    p.add_argument("--cache-fraction", type=float, default=0.5)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="loader workers / DALI threads")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prep-configs", default="dali,dali_loader,coordl,torch")
    p.add_argument("--fetch-configs", default="dali,dali_loader")
    p.add_argument("--skip-prep-bound", action="store_true")
    p.add_argument("--skip-fetch-bound", action="store_true")
    p.add_argument("--coordinated", action="store_true", help="also part (3): two jobs at once")
    p.add_argument("--replicate", type=int, default=1,
                   help="hardlink every image this many times: longer epochs (GPU prep runs an epoch of 1000 in 0.1 s)")  # fmt: skip
    p.add_argument("--coordinate", default="", help=argparse.SUPPRESS)  # (child) the group's name
    p.add_argument(
        "--barrier", default="", help=argparse.SUPPRESS
    )  # (child) start together with the other job
    p.add_argument(
        "--data-dir", default="/var/tmp/coordl-bench-data", help="where the synthetic dataset is kept"
    )
    p.add_argument("--json", type=Path, help="also write raw results here")
    p.add_argument("--photos", action="store_true",
                   help="part (1) also on the photographic dataset of --n files (coordl synth --photos), "
                   "alternated with the synthetic one in every run")  # fmt: skip
    args = p.parse_args()
    if args.child:
        child(args)
        return
    from coordl.datasets import synth

    src = synth.make_dataset(
        Path(args.data_dir) / f"synth-{args.n}-{args.classes}", n=args.n, classes=args.classes
    )
    if args.replicate > 1:
        from plainstore import link_copies

        src = link_copies(src, args.replicate)
    dataset_bytes = sum(f.stat().st_size for f in _files(src))
    roots = {"synth": str(src)}
    if args.photos:
        import datakind

        roots["photos"] = str(datakind.photos_root(args.n, args.classes, data_dir=args.data_dir))
    prep_bytes = max(sum(f.stat().st_size for f in _files(Path(r))) for r in roots.values())
    print(
        f"dataset: {args.n} images x {args.replicate}, {dataset_bytes / 1e6:.1f} MB; load average {os.getloadavg()}",
        flush=True,
    )
    prep = {} if args.skip_prep_bound else prep_bound(args, roots, prep_bytes)
    fetch = {} if args.skip_fetch_bound else fetch_bound(args, src, dataset_bytes)
    coord = coordinated(args, str(src)) if args.coordinated else {}
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(
            {"prep": prep, "fetch": fetch, "coordinated": coord, "dataset_bytes": dataset_bytes}, indent=1))  # fmt: skip
    for kind, res in prep.items():
        print_prep(res, args, kind)
    if fetch:
        print_fetch(fetch, args, dataset_bytes)
    if coord:
        print_coordinated(coord, args)


if __name__ == "__main__":
    main()

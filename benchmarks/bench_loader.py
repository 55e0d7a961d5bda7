"""Loader comparison on slow storage: torch+Pillow, torch+simplejpeg, DALI CPU, coordl (MinIO 50%).

    sudo .venv/bin/python benchmarks/bench_loader.py              # ~10 min on the 2-core VM
    sudo .venv/bin/python benchmarks/bench_loader.py --runs 1 --n 1000   # quick look
    sudo .venv/bin/python benchmarks/bench_loader.py --n 2000 --skip-fetch-bound --prep-configs bcdh \
        --recipes resize_first,standard_full,standard,standard_indexed    # the recipes side by side (issue 27)

Same dataset (synthetic ImageFolder, 500x375 JPEGs of ~90 KB), same transform (``--recipe``, default
``standard``: decode, random-resized-crop 224 of the full image, flip, normalize to float CHW; see
``prep_recipes.py`` for ``resize_first``, ``standard_full`` and ``standard_indexed``, which reads a copy
of the dataset rewritten by ``coordl crop-index``, with a cache of the same share of its bytes), same batch size and worker count
(= cores), 3 epochs, shuffled:

(a) ``torch.utils.data.DataLoader`` over a Pillow ImageFolder-style dataset: what users run today
    (torchvision's PIL path, rebuilt here with Pillow because torchvision has no CPU build here);
(b) the same loader over ``coordl.ImageFolder`` with ``coordl.transforms`` (simplejpeg decode, torch
    uint8 resize): separates the decode gain from the cache gain;
(c) NVIDIA DALI's CPU-only pipeline (``device_id=None``: file reader, CPU decode, resize,
    random_resized_crop, crop_mirror_normalize) through ``DALIGenericIterator``; skipped with a note
    when ``nvidia-dali-cuda130`` is not installed (``pip install -e .[dali]``);
(d) ``coordl.DataLoader`` over ``coordl.ImageFolder`` with ``cache_bytes`` = 50% of the dataset.

Method (``benchmarks/slowstore.py``): the dataset is copied onto an ext4 file system on a loop device
whose reads are throttled by a cgroup-v1 blkio limit (``--read-mb-s``), so the loaders are
fetch-bound. Each run is a child process in a memory cgroup whose limit is kept at the processes'
own memory plus a data budget equal to coordl's cache (50% of the dataset): the page-cache loaders
may keep the budget in the OS page cache; coordl keeps its shared-memory cache in it (its own
page-cache bound is the budget minus its cache, i.e. zero). Every run gets 8 MiB of page cache on
top, for file-system metadata and reads in flight. The
dataset's pages are dropped (``posix_fadvise(DONTNEED)``) before every run. Storage bytes come
from the blkio counter of the loop device (only the dataset lives there); hit ratio is
``1 - storage bytes / dataset bytes`` for page-cache loaders, coordl's own counter for (d). CPU
seconds per sample: user+system time of the child and its workers over items. Configurations
alternate within each of ``--runs`` rounds; tables show medians.

First (unless ``--skip-cpu-table``) ``prep_recipes.cpu_table``: CPU per sample of each recipe in one
process, coordl's transforms and DALI's CPU pipeline, at 500x375 and 1000x750.

Then the prep-bound check, once per recipe of ``--recipes``: storage unthrottled; (b), (d), and coordl with its batch ring off (e),
copying out of it (f), without its worker heap setting (g), with persistent workers (h), or reading
every storage miss ahead in threads as before :mod:`coordl.fetch.pace` (i), or (h) with its misses read
through the page cache as before ``page_cache=`` (j), or (h) reading ahead in Python threads instead of native
ones (k), or (h) making every storage read in its prep thread, as the bound does (l), or (h) with
``prefetch_factor=4`` (m), and the floor of torch's worker protocol (n): torch's ``DataLoader`` with persistent
workers over the dataset's bytes already in memory, the transform's output dropped (no fetch, no cache,
no stacking, no shared memory: only the prep, torch's queues and the main process), and (o): (n) with the
bound's reads (the items a 50% cache would hold in memory, every other one read with ``O_DIRECT`` in the
worker when its turn comes: a loader with no cost of its own on torch's protocol), against the machine's decode limit, i.e. ``cores`` processes each running a tight decode+augment loop over
bytes in memory, at once, rates summed, and (once a round) the bound: the same loops over the whole dataset
making the storage reads that a 50% cache leaves every loader (``decode_limit.py``; what a loader with no
cost of its own would reach here); measured alternately in the same run (``--prep-configs``),
in the same cgroups and under the same page-cache controller as the loaders (which costs CPU too).
On a machine shared with other work the wall rates depend on the load, so CPU seconds per sample
are reported too: ``limit CPU / loader CPU`` is the fraction of the loader's CPU spent on the prep
itself. A second table splits CPU time and minor page faults per sample between the main process
and the workers (``getrusage`` and ``/proc/<pid>/stat``).

Where slowstore cannot run (no root or no cgroup v1, as on a GPU host), ``--no-slowstore --skip-fetch-bound`` measures the
prep-bound table alone over the dataset's own folder (``plainstore.PlainStore``: no throttle, page cache unbounded,
no bound row); with ``--cache-fraction 1`` every loader is fully cached. ``--limit-procs`` sets the limit's loops
(default: the cores; a run with fewer workers than cores compares with as many loops as workers);
``--replicate K`` hardlinks every image K times (a longer epoch: its start and end weigh less).
``--photos`` runs each recipe's prep-bound rows also on the photographic dataset of ``--n`` files (``coordl synth
--photos``; crop-indexed for ``standard_indexed``), alternated with the synthetic runs in every round.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import prep_recipes  # noqa: E402  (the recipes and the one-process CPU table)
from decode_limit import cached_items, decode_limit, machine_cpu  # noqa: E402  (the prep-bound references)

CONFIGS = {
    "a": "torch DataLoader + Pillow",
    "b": "torch DataLoader + simplejpeg",
    "c": "DALI CPU pipeline",
    "d": "coordl.DataLoader, cache 50%",
    "e": "coordl.DataLoader, cache 50%, batch_ring=False",
    "f": "coordl.DataLoader, cache 50%, batch_ring='copy'",
    "g": "coordl.DataLoader, cache 50%, ring without the workers' heap setting",
    "h": "coordl.DataLoader, cache 50%, persistent_workers=True",
    "i": "coordl.DataLoader, cache 50%, every storage read ahead in threads (before ReadPace)",
    "j": "coordl.DataLoader, cache 50%, persistent_workers=True, page_cache='use' (misses through the page cache)",
    "k": "coordl.DataLoader, cache 50%, persistent_workers=True, read-ahead in Python threads (before the native one)",
    "l": "coordl.DataLoader, cache 50%, persistent_workers=True, every storage read in the prep thread (no read-ahead)",
    "m": "coordl.DataLoader, cache 50%, persistent_workers=True, prefetch_factor=4",
    "n": "torch DataLoader, persistent workers, items in memory, output dropped (the protocol's floor)",
    "o": "(n) with the bound's reads: the uncached half read with O_DIRECT in line (no loader cost on torch)",
}
COORDL = {
    "d": True,
    "e": False,
    "f": "copy",
    "g": True,
    "h": True,
    "i": True,
    "j": True,
    "k": True,
    "l": True,
    "m": True,
}  # -> batch_ring
RESIZE, CROP = 256, 224
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
PHOTOS = "@photos"  # --photos: a recipe's prep-bound runs on the photographic dataset
TODAY = "resize_first"  # coordl's train_transform before issue 27: the baseline of the recipe table
# Page cache every run gets on top of its budget: file-system metadata and reads in flight. Without
# it a loader with a zero page-cache budget re-reads inode blocks and half-read files.
METADATA_ALLOWANCE_BYTES = 8 << 20


# -- child side ------------------------------------------------------------------------------------


class PillowFolder:
    """An ImageFolder-style dataset doing torchvision's PIL path: open, convert, resize, crop, flip."""

    def __init__(self, root: str) -> None:
        from coordl.datasets.files import ImageFolder
        from coordl.prep.transforms import RandomResizedCrop

        self.samples = ImageFolder(root).samples
        self.rrc = RandomResizedCrop(CROP)  # only its crop-parameter sampler (torch RNG)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        import numpy as np
        import torch
        from PIL import Image

        path, target = self.samples[i]
        with open(path, "rb") as f:
            img = Image.open(f).convert("RGB")
        w, h = img.size
        s = RESIZE / min(w, h)
        img = img.resize((max(RESIZE, int(w * s)), max(RESIZE, int(h * s))), Image.Resampling.BILINEAR)
        top, left, ch, cw = self.rrc.get_params(img.height, img.width)
        img = img.resize((CROP, CROP), Image.Resampling.BILINEAR, box=(left, top, left + cw, top + ch))
        if torch.rand(1).item() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        t = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float().div_(255)
        mean = torch.tensor(MEAN)[:, None, None]
        std = torch.tensor(STD)[:, None, None]
        return t.sub_(mean).div_(std), target


class InMemoryFolder:
    """(n): the dataset's bytes read into memory up front; an item runs the transform and returns only
    its label. What a torch ``DataLoader`` costs beyond the prep itself when it fetches, caches and
    stacks nothing: its worker protocol (index and result queues, the main process, three processes
    on the cores).

    (o), ``cache_fraction`` < 1: only the items the bound keeps in memory (``decode_limit.cached_items``,
    the same seeded draw) are read up front; every other one is read with ``read_file(cached=False)``
    in the worker when its turn comes, as the bound's loops read it."""

    def __init__(self, root: str, transform, cache_fraction: float = 1.0) -> None:
        from coordl.datasets.files import ImageFolder
        from coordl.fileread.read import read_file

        samples = ImageFolder(root).samples
        kept = cached_items(len(samples), cache_fraction)
        self.paths = [path for path, _ in samples]
        self.raws = [Path(path).read_bytes() if i in kept else None for i, (path, _) in enumerate(samples)]
        self.targets = [target for _, target in samples]
        self.transform = transform
        self._read = read_file  # imported here: the benchmark's children import coordl, not its parent

    def __len__(self) -> int:
        return len(self.raws)

    def __getitem__(self, i: int) -> int:
        raw = self.raws[i]
        self.transform(raw if raw is not None else self._read(self.paths[i], cached=False))
        return self.targets[i]


def _labels_only(batch: list) -> tuple[None, list]:
    return None, batch


def _usage() -> dict[str, float]:
    """CPU seconds and minor page faults of this process (main) and of its workers, reaped or live."""
    import psutil

    me, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    out = {
        "main_cpu_s": me.ru_utime + me.ru_stime,
        "main_minflt": float(me.ru_minflt),
        "workers_cpu_s": reaped.ru_utime + reaped.ru_stime,
        "workers_sys_s": reaped.ru_stime,  # the kernel's share: reads, page faults, memory-cgroup reclaim
        "workers_minflt": float(reaped.ru_minflt),
    }
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
            with open(f"/proc/{child.pid}/stat") as f:
                minflt = int(f.read().rsplit(")", 1)[1].split()[7])
        except (psutil.Error, OSError):
            continue
        out["workers_cpu_s"] += t.user + t.system
        out["workers_sys_s"] += t.system
        out["workers_minflt"] += minflt
    return out


def _cpu_s() -> float:
    """CPU seconds of this process, its reaped children and its live children (workers)."""
    u = _usage()
    return u["main_cpu_s"] + u["workers_cpu_s"]


def _blkio_read(path: str, device: str) -> int:
    """Bytes read from ``device`` (major:minor) by the cgroup: cgroup v1's blkio.throttle.io_service_bytes
    ("8:0 Read 123" lines) or cgroup v2's io.stat ("8:0 rbytes=123 wbytes=..." lines)."""
    total = 0
    if not device:  # --no-slowstore: no storage counter
        return 0
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[0] == device and parts[1] == "Read":
                total += int(parts[2])
            elif parts and parts[0] == device:
                total += sum(int(kv[7:]) for kv in parts[1:] if kv.startswith("rbytes="))
    return total


def _dali_loader(root: str, batch_size: int, threads: int, seed: int, recipe: str):
    from nvidia.dali import fn, pipeline_def
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=None, seed=seed)
    def pipe():
        # Plain read() like the other loaders: with mmap, pages reclaimed under the memory bound
        # while still mapped are faulted in again, and storage reads inflate by ~40%.
        jpegs, labels = fn.readers.file(
            file_root=root, random_shuffle=True, name="Reader", seed=seed, dont_use_mmap=True
        )
        return prep_recipes.dali_graph(recipe, jpegs), labels

    return DALIGenericIterator(
        [pipe()],
        ["data", "label"],
        reader_name="Reader",
        last_batch_policy=LastBatchPolicy.PARTIAL,
        auto_reset=True,
    )


def child(args: argparse.Namespace) -> None:
    import torch

    import coordl

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(args.seed)
    common = dict(batch_size=args.batch_size, shuffle=True, num_workers=args.workers, generator=gen)
    if args.child == "a":
        loader = torch.utils.data.DataLoader(PillowFolder(args.root), **common)
    elif args.child == "b":
        loader = torch.utils.data.DataLoader(
            coordl.ImageFolder(args.root, prep_recipes.make_transform(args.recipe)), **common
        )
    elif args.child in ("n", "o"):
        fraction = args.cache_fraction if args.child == "o" else 1.0
        ds = InMemoryFolder(args.root, prep_recipes.make_transform(args.recipe), fraction)
        loader = torch.utils.data.DataLoader(ds, persistent_workers=True, collate_fn=_labels_only, **common)
    elif args.child == "c":
        loader = _dali_loader(args.root, args.batch_size, args.workers, args.seed, args.recipe)
    else:
        ds = coordl.ImageFolder(args.root, prep_recipes.make_transform(args.recipe))
        if args.child == "g":  # attribution only: the ring without its mallopt in the workers
            import coordl.ring.writer

            coordl.ring.writer._keep_freed_heap = lambda batch_bytes: None
        if args.child in ("i", "l"):  # attribution only: storage reads never made in the prep thread (i,
            # limit 0 s), or always made there, where the bound makes them (l)
            import coordl.fetch.ahead
            from coordl.fetch.pace import ReadPace

            limit_s = 0.0 if args.child == "i" else float("inf")
            coordl.fetch.ahead.ReadPace = lambda: ReadPace(limit_s=limit_s)
        if args.child == "k":  # attribution only: the read-ahead's Python threads, as without the extension
            import coordl.fileread.read

            coordl.fileread.read._readahead = None
        ring, persistent = COORDL[args.child], args.child in ("h", "j", "k", "l", "m")
        page_cache = "use" if args.child == "j" else "auto"  # j: attribution of page_cache= (before it)
        if args.child == "m":
            common["prefetch_factor"] = 4
        loader = coordl.DataLoader(
            ds, cache_bytes=args.cache_bytes, batch_ring=ring, persistent_workers=persistent,
            page_cache=page_cache, **common,
        )  # fmt: skip
    epochs = []
    for _ in range(args.epochs):
        read0, use0, t0 = _blkio_read(args.blkio, args.device), _usage(), time.perf_counter()
        machine0 = machine_cpu()
        n = 0
        for batch in loader:
            n += len(batch[0]["label"]) if args.child == "c" else len(batch[1])
        elapsed = time.perf_counter() - t0
        use = {k: v - use0[k] for k, v in _usage().items()}
        machine = machine_cpu()
        use["machine_busy_s"], use["machine_steal_s"] = machine[0] - machine0[0], machine[1] - machine0[1]
        epochs.append(
            {
                "time_s": elapsed,
                "items": n,
                "disk_bytes": _blkio_read(args.blkio, args.device) - read0,
                "cpu_s": use["main_cpu_s"] + use["workers_cpu_s"],
                **use,
            }
        )
    if args.child in COORDL:
        for e, st in zip(epochs, loader.epoch_stats(), strict=False):
            e["hit_ratio"] = st["hit_ratio"]
        loader.close()
    print(json.dumps({"epochs": epochs}))


# -- parent side -----------------------------------------------------------------------------------


def _dali_available() -> bool:
    code = "import nvidia.dali, nvidia.dali.plugin.pytorch"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120).returncode == 0


def _run_child(
    store,
    config: str,
    args: argparse.Namespace,
    root: str,
    seed: int,
    cache_bytes: int,
    page_budget: int,
    recipe: str,
) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        config,
        "--root",
        root,
        "--seed",
        str(seed),
        "--recipe",
        recipe,
    ]
    cmd += [
        "--epochs",
        str(args.epochs),
        "--workers",
        str(args.workers),
        "--batch-size",
        str(args.batch_size),
    ]
    cmd += ["--cache-bytes", str(cache_bytes), "--device", store.device]
    cmd += ["--blkio", store.io_counter]
    in_memory = config in COORDL or config == "o"  # their cached share is their own memory, not page cache
    page_cache = max(page_budget - cache_bytes, 0) if in_memory else page_budget
    store.set_page_cache_bytes(page_cache + METADATA_ALLOWANCE_BYTES)
    store.evict()
    ctl0, t0 = store.controller_cpu_s, time.monotonic()
    out = json.loads(store.run(cmd).strip().splitlines()[-1])
    out["controller_cores"] = (store.controller_cpu_s - ctl0) / (time.monotonic() - t0)
    return out


def _run_limit(
    store,
    args: argparse.Namespace,
    root: str,
    page_budget: int,
    recipe: str,
    cache_bytes: int = 0,
    kind: str = "limit",
) -> tuple[float, ...]:
    """The decode limit (``kind="limit"``), or the bound with the storage reads (``"bound"``), whose
    cached share is in its own memory like coordl's cache (so its page-cache budget is the rest)."""
    cmd = [sys.executable, __file__, "--child", kind, "--root", root, "--workers", str(args.limit_procs)]
    cmd += ["--recipe", recipe, "--cache-fraction", str(args.cache_fraction)]
    store.set_page_cache_bytes(max(page_budget - cache_bytes, 0) + METADATA_ALLOWANCE_BYTES)
    if kind == "bound":
        store.evict()
    ctl0, t0 = store.controller_cpu_s, time.monotonic()
    out = json.loads(store.run(cmd).strip().splitlines()[-1])
    return (*out, (store.controller_cpu_s - ctl0) / (time.monotonic() - t0))


def _med(values) -> float:
    return statistics.median(values)


def lru_hit_ratio(fraction: float) -> float:
    """Expected hit ratio of an LRU cache holding ``fraction`` of the items under a fresh random
    permutation every epoch: an item hits when fewer than the cache's size of distinct items came between
    its last two reads, which gives ``f + (1 - f) ln(1 - f)`` (0.15 at f = 0.5)."""
    f = min(max(fraction, 0.0), 1.0)
    return 1.0 if f >= 1.0 else f + (1 - f) * math.log(1 - f)


def print_fetch_table(results: dict, dataset_bytes: int, args: argparse.Namespace, notes: list[str]) -> None:
    print(
        f"\n### Fetch-bound: {args.n} images, {dataset_bytes / 1e6:.0f} MB, storage {args.read_mb_s:g} MB/s, "
        f"memory budget {args.cache_fraction:.0%} of the dataset, {args.workers} workers, batch {args.batch_size}, "
        f"median of {args.runs} runs\n"
    )
    print(
        "Bytes bound: (a)'s storage bytes over this loader's, the speedup a purely fetch-bound loader gets.\n"
    )
    print(
        "| loader | epoch | samples/s | vs (a) | bytes bound | CPU s/sample | hit ratio | storage MB read |"
    )
    print("|---|---|---|---|---|---|---|---|")
    base = results.get("a")

    def med(runs: list, e: int, key: str) -> float:
        return _med(r["epochs"][e][key] for r in runs)

    for cfg, runs in results.items():
        for e in range(args.epochs):
            rate = _med(r["epochs"][e]["items"] / r["epochs"][e]["time_s"] for r in runs)
            disk = med(runs, e, "disk_bytes")
            cpu = _med(r["epochs"][e]["cpu_s"] / max(r["epochs"][e]["items"], 1) for r in runs)
            hit = med(runs, e, "hit_ratio") if cfg in COORDL else max(0.0, 1 - disk / dataset_bytes)
            vs = bound = ""
            if base:
                base_rate = _med(r["epochs"][e]["items"] / r["epochs"][e]["time_s"] for r in base)
                vs = f"{rate / base_rate:.2f}x"
                bound = f"{med(base, e, 'disk_bytes') / max(disk, 1):.2f}x"
            name = f"({cfg}) {CONFIGS[cfg]}" if e == 0 else ""
            print(
                f"| {name} | {e + 1} | {rate:.0f} | {vs} | {bound} | {cpu * 1000:.2f} ms | {hit:.2f} | "
                f"{disk / 1e6:.1f} |"
            )
    budget = (dataset_bytes * args.cache_fraction + METADATA_ALLOWANCE_BYTES) / dataset_bytes
    lru = lru_hit_ratio(budget)
    print(
        f"\nAn LRU page cache holding {budget:.1%} of the dataset (budget + metadata allowance) hits "
        f"{lru:.2f} of reads under a shuffled order; a cache that never evicts, {args.cache_fraction:.2f}. "
        f"Against it a fetch-bound loader can be at most {(1 - lru) / (1 - args.cache_fraction):.2f}x faster."
    )
    for note in notes:
        print(f"\nNote: {note}")


def _prep_summary(res: dict) -> dict[str, float]:
    """Rate and per-sample CPU / faults over epochs 2.. (epoch 1 fills coordl's cache and the page cache)."""
    later = res["epochs"][1:]
    items = sum(e["items"] for e in later)
    wall = sum(e["time_s"] for e in later)
    out = {"rate": items / wall, "controller_cores": res["controller_cores"]}
    for key in ("cpu_s", "main_cpu_s", "workers_cpu_s", "workers_sys_s", "main_minflt", "workers_minflt"):
        out[key] = sum(e.get(key, 0.0) for e in later) / items
    out["machine_busy"] = sum(e["machine_busy_s"] for e in later) / wall
    out["machine_steal"] = sum(e["machine_steal_s"] for e in later) / wall
    return out


def _label(recipe: str) -> str:
    name = prep_recipes.RECIPES[recipe.removesuffix(PHOTOS)]
    return f"{name}, on the photographs" if recipe.endswith(PHOTOS) else name


def print_prep_table(prep: dict, args: argparse.Namespace, recipe: str) -> None:
    lim_rate, lim_cpu = _med(r[0] for r in prep["limit"]), _med(r[1] for r in prep["limit"])
    print(
        f"\n### Prep-bound, {_label(recipe)} (storage unthrottled, epochs 2-{args.epochs}), "
        f"median of {args.runs}\n"
    )
    print("% of limit and the CPU ratio: medians of each run's ratio to the limit measured just before it.\n")
    print("| | samples/s (runs) | % of limit (runs) | CPU s/sample | limit CPU / loader CPU | cores busy |")
    print("|---|---|---|---|---|---|")
    runs = ", ".join(f"{r[0]:.0f}" for r in prep["limit"])
    busy = _med(r[0] * r[1] for r in prep["limit"])
    print(
        f"| decode limit: {args.limit_procs} processes x tight decode+augment loop | {lim_rate:.0f} ({runs}) | "
        f"100% | {lim_cpu * 1000:.2f} ms | 1.00 | {busy:.2f} |"
    )
    if prep.get("bound"):
        b, shares = prep["bound"], [r[0] / r[6] for r in prep["bound"]]
        print(
            f"| bound: the same loops + the storage reads of a {args.cache_fraction:.0%} cache (O_DIRECT) | "
            f"{_med(r[0] for r in b):.0f} ({', '.join(f'{r[0]:.0f}' for r in b)}) | {_med(shares):.0%} "
            f"({', '.join(f'{x:.0%}' for x in shares)}) | {_med(r[1] for r in b) * 1000:.2f} ms | "
            f"{_med(r[7] / r[1] for r in b):.2f} | {_med(r[0] * r[1] for r in b):.2f} |"
        )
    for cfg in args.prep_configs:
        rate, cpu = _med(r["rate"] for r in prep[cfg]), _med(r["cpu_s"] for r in prep[cfg])
        runs = ", ".join(f"{r['rate']:.0f}" for r in prep[cfg])
        shares = [r["rate"] / r["limit_rate"] for r in prep[cfg]]
        cpu_ratio = _med(r["limit_cpu_s"] / r["cpu_s"] for r in prep[cfg])
        busy = _med(r["rate"] * r["cpu_s"] for r in prep[cfg])
        print(
            f"| ({cfg}) {CONFIGS[cfg]} | {rate:.0f} ({runs}) | {_med(shares):.0%} "
            f"({', '.join(f'{x:.0%}' for x in shares)}) | {cpu * 1000:.2f} ms | {cpu_ratio:.2f} | {busy:.2f} |"
        )
    print("\nThe whole machine while measuring (cores; median): busy = every process and kernel thread,")
    print(
        "ours = the loader's processes (or the limit's loops), controller = the page-cache bound's thread.\n"
    )
    print("| | machine busy | ours | busy, not ours | stolen | controller |")
    print("|---|---|---|---|---|---|")
    lim_busy, lim_steal, lim_ctl = (_med(r[i] for r in prep["limit"]) for i in (3, 4, 5))
    lim_ours = _med(r[0] * r[1] for r in prep["limit"])
    print(
        f"| decode limit | {lim_busy:.2f} | {lim_ours:.2f} | {lim_busy - lim_ours:.2f} | {lim_steal:.2f} | "
        f"{lim_ctl:.2f} |"
    )
    for cfg in args.prep_configs:
        busy, steal, ctl = (
            _med(r[k] for r in prep[cfg]) for k in ("machine_busy", "machine_steal", "controller_cores")
        )
        ours = _med(r["rate"] * r["cpu_s"] for r in prep[cfg])
        print(f"| ({cfg}) | {busy:.2f} | {ours:.2f} | {busy - ours:.2f} | {steal:.2f} | {ctl:.2f} |")
    print("\nWhere the loader's time goes, per sample (median):\n")
    print("| | main CPU | workers CPU | of which kernel | main minor faults | workers minor faults |")
    print("|---|---|---|---|---|---|")
    lim_faults = _med(r[2] for r in prep["limit"])
    print(f"| decode limit (one loop) | - | {lim_cpu * 1000:.2f} ms | - | - | {lim_faults:.0f} |")
    for cfg in args.prep_configs:
        m = {
            k: _med(r[k] for r in prep[cfg])
            for k in ("main_cpu_s", "workers_cpu_s", "workers_sys_s", "main_minflt", "workers_minflt")
        }
        print(
            f"| ({cfg}) | {m['main_cpu_s'] * 1000:.2f} ms | {m['workers_cpu_s'] * 1000:.2f} ms | "
            f"{m['workers_sys_s'] * 1000:.2f} ms | {m['main_minflt']:.0f} | {m['workers_minflt']:.0f} |"
        )


def print_recipe_summary(prep: dict, args: argparse.Namespace) -> None:
    """One table over the recipes: each loader's rate, its share of its recipe's limit, and both
    against today's limit (the resize-first recipe's), rates and CPU per sample."""
    if TODAY not in prep:
        return
    today_rate = _med(r[0] for r in prep[TODAY]["limit"])
    today_cpu = _med(r[1] for r in prep[TODAY]["limit"])
    print(f"\n### Recipes side by side (prep-bound, {os.cpu_count()} cores, median of {args.runs})\n")
    print(
        f"x today = rate / today's limit ({prep_recipes.RECIPES[TODAY]}, {today_rate:.0f}/s); CPU x today = "
        f"today's limit CPU per sample / this row's ({today_cpu * 1000:.2f} ms). % of limit: of its own recipe's.\n"
    )
    print("| recipe | loader | samples/s | % of its limit | x today | CPU ms/sample | CPU x today |")
    print("|---|---|---|---|---|---|---|")
    for recipe, res in prep.items():
        lim_rate, lim_cpu = _med(r[0] for r in res["limit"]), _med(r[1] for r in res["limit"])
        print(
            f"| {_label(recipe)} | limit: {args.limit_procs} x tight loop | {lim_rate:.0f} | 100% | "
            f"{lim_rate / today_rate:.2f}x | {lim_cpu * 1000:.2f} | {today_cpu / lim_cpu:.2f}x |"
        )
        if res.get("bound"):
            rate, cpu = _med(r[0] for r in res["bound"]), _med(r[1] for r in res["bound"])
            print(
                f"| | bound: limit loops + the storage reads | {rate:.0f} | "
                f"{_med(r[0] / r[6] for r in res['bound']):.0%} | {rate / today_rate:.2f}x | {cpu * 1000:.2f} | "
                f"{today_cpu / cpu:.2f}x |"
            )
        for cfg in args.prep_configs:
            if not res.get(cfg):
                continue
            rate, cpu = _med(r["rate"] for r in res[cfg]), _med(r["cpu_s"] for r in res[cfg])
            share = _med(r["rate"] / r["limit_rate"] for r in res[cfg])
            print(
                f"| | ({cfg}) {CONFIGS[cfg]} | {rate:.0f} | {share:.0%} | {rate / today_rate:.2f}x | "
                f"{cpu * 1000:.2f} | {today_cpu / cpu:.2f}x |"
            )


def run_prep_bound(store, args: argparse.Namespace, roots: dict[str, tuple[str, int]]) -> dict:
    """``{recipe: {"limit": [...], config: [...]}}``: each loader right after a limit measurement.
    ``roots``: recipe -> (the dataset it reads, its cache budget in bytes)."""
    configs = args.prep_configs
    prep: dict[str, dict[str, list]] = {
        r: {"limit": [], "bound": [], **{c: [] for c in configs}} for r in args.recipes
    }
    store.set_read_bps(None)
    for run in range(args.runs):
        for recipe in args.recipes:
            root, cache_bytes = roots[recipe]
            prep_fn = recipe.removesuffix(PHOTOS)  # "standard@photos": the standard recipe on the photographs
            order = configs[run % len(configs) :] + configs[: run % len(configs)]
            for cfg in order:
                # The limit is measured right before each loader (the machine's load drifts), in the
                # same cgroups under the same page-cache controller as the loaders.
                prep[recipe]["limit"].append(_run_limit(store, args, root, cache_bytes, prep_fn))
                # once a round: the bound with this benchmark's storage reads (none without slowstore)
                if cfg == order[0] and not args.no_slowstore:
                    bound = _run_limit(store, args, root, cache_bytes, prep_fn, cache_bytes, kind="bound")
                    prep[recipe]["bound"].append(
                        (*bound, *prep[recipe]["limit"][-1][:2])
                    )  # + that limit's rate, CPU
                res = _run_child(store, cfg, args, root, args.seed + run, cache_bytes, cache_bytes, prep_fn)
                summary = _prep_summary(res)
                summary["limit_rate"], summary["limit_cpu_s"] = prep[recipe]["limit"][-1][:2]
                prep[recipe][cfg].append(summary)
            rates = ", ".join(
                f"({c}) {prep[recipe][c][-1]['rate']:.0f}/s vs limit {prep[recipe][c][-1]['limit_rate']:.0f}/s"
                for c in configs
            )
            print(f"prep-bound run {run}, {recipe}: {rates}", flush=True)
    return prep


def _parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", choices=[*sorted(CONFIGS), "limit", "bound"])
    p.add_argument("--root", default="")
    p.add_argument("--device", default="")
    p.add_argument("--blkio", default="")
    p.add_argument("--cache-bytes", type=int, default=0)
    p.add_argument("--n", type=int, default=1000, help="images (default 1000)")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--read-mb-s", type=float, default=8.0, help="storage read throttle, MB/s (default 8)")
    p.add_argument("--cache-fraction", type=float, default=0.5)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="loader workers / DALI threads")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--configs", default="abcd", help="which loaders, fetch-bound (default abcd)")
    p.add_argument("--prep-configs", default="bdefgh", help="which loaders, prep-bound (default bdefgh)")
    p.add_argument("--recipe", default="standard", choices=sorted(prep_recipes.RECIPES),
                   help="the training prep of the fetch-bound loaders (and of a --child)")  # fmt: skip
    p.add_argument("--recipes", default="standard", type=lambda v: v.split(","),
                   help="comma-separated recipes of the prep-bound section (default standard)")  # fmt: skip
    p.add_argument("--skip-prep-bound", action="store_true")
    p.add_argument("--skip-fetch-bound", action="store_true")
    p.add_argument("--skip-cpu-table", action="store_true", help="skip the one-process CPU table")
    p.add_argument("--limit-procs", type=int, default=os.cpu_count() or 1,
                   help="tight loops of the decode limit (default: the cores; the GPU check: = --workers)")  # fmt: skip
    p.add_argument(
        "--replicate",
        type=int,
        default=1,
        help="hardlink every image this many times (a longer epoch, no more images to make)",
    )
    p.add_argument("--no-slowstore", action="store_true",
                   help="prep-bound only, where slowstore cannot run (no root or no cgroup v1): the dataset in its "
                        "plain folder, page cache unbounded, no bound row (plainstore.PlainStore)")  # fmt: skip
    p.add_argument("--slack-mb", type=int, default=64,
                   help="allocation headroom of the memory cgroup over its usage (slowstore; default 64): "
                        "raise it on a loaded machine, where the controller thread may not run every 5 ms")  # fmt: skip
    p.add_argument(
        "--data-dir", default="/var/tmp/coordl-bench-data", help="where the synthetic dataset is kept"
    )
    p.add_argument("--json", type=Path, help="also write raw results here")
    p.add_argument("--photos", action="store_true",
                   help="the prep-bound section also on the photographic dataset of --n files (coordl synth "
                        "--photos), each recipe's runs alternated with the synthetic ones")  # fmt: skip
    args = p.parse_args()
    unknown = [r for r in args.recipes if r not in prep_recipes.RECIPES]
    if unknown:
        p.error(f"--recipes: unknown {unknown}; choose from {sorted(prep_recipes.RECIPES)}")
    if args.no_slowstore and not args.skip_fetch_bound:
        p.error("--no-slowstore measures only the prep-bound table: add --skip-fetch-bound")
    return args


def _bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.glob("class_*/*") if f.is_file())


def _photo_sources(args: argparse.Namespace) -> dict[str, Path]:
    """``{"<recipe>@photos": the photographic dataset of --n files (crop-indexed for such recipes)}``."""
    import datakind

    from coordl.prep.cropindex import index_tree

    src = datakind.photos_root(args.n, args.classes, data_dir=args.data_dir)
    out = {}
    for recipe in args.recipes:
        path = src
        if recipe in prep_recipes.INDEXED:
            path = src.with_name(src.name + "-crop-indexed")
            index_tree(src, path)  # PNG and CMYK files copied as they are
        out[recipe + PHOTOS] = path
    return out


def main() -> None:
    args = _parse_args()
    if args.child in ("limit", "bound"):
        reads = args.child == "bound"
        out = decode_limit(
            args.root, args.workers, 600, args.recipe, reads=reads, cache_fraction=args.cache_fraction
        )
        print(json.dumps(out))
        return
    if args.child:
        child(args)
        return

    from plainstore import PlainStore, link_copies
    from slowstore import SlowStore, copy_tree

    from coordl.datasets import synth

    src = synth.make_dataset(
        Path(args.data_dir) / f"synth-{args.n}-{args.classes}", n=args.n, classes=args.classes
    )
    if args.replicate > 1:
        src = link_copies(src, args.replicate)
    dataset_bytes = _bytes(src)
    cache_bytes = int(dataset_bytes * args.cache_fraction)
    indexed_src = None
    if any(
        r in prep_recipes.INDEXED for r in args.recipes
    ):  # the same images, rewritten by coordl crop-index
        from coordl.prep.cropindex import index_tree

        indexed_src = Path(args.data_dir) / f"synth-{args.n}-{args.classes}-crop-indexed"
        index_tree(src, indexed_src)
    indexed_bytes = _bytes(indexed_src) if indexed_src else 0
    photos = _photo_sources(args) if args.photos else {}
    notes: list[str] = []
    configs = list(args.configs)
    dali = _dali_available()
    if not dali:
        configs = [c for c in configs if c != "c"]
        args.prep_configs = args.prep_configs.replace("c", "")
        notes.append("(c) DALI skipped: nvidia-dali-cuda130 is not installed (pip install -e '.[dali]').")
    cpu = None if args.skip_cpu_table else prep_recipes.cpu_table(dali=dali)
    image_bytes = int((dataset_bytes + indexed_bytes + sum(map(_bytes, photos.values()))) * 1.6) + (128 << 20)
    results: dict[str, list[dict]] = {c: [] for c in configs}
    prep: dict = {}
    with (
        PlainStore(args.data_dir)
        if args.no_slowstore
        else SlowStore(
            image_bytes,
            int(args.read_mb_s * 1e6),
            page_cache_bytes=cache_bytes,
            slack_bytes=args.slack_mb << 20,
        )
    ) as store:
        root = os.path.join(store.mount, "data")
        if args.no_slowstore:
            root = str(src)
        else:
            copy_tree(src, root)
        # Each recipe's loaders get the same share of their own dataset's bytes as cache.
        roots = {r: (root, cache_bytes) for r in args.recipes}
        if indexed_src is not None:
            copy_tree(indexed_src, os.path.join(store.mount, "data-indexed"))
            indexed = (os.path.join(store.mount, "data-indexed"), int(indexed_bytes * args.cache_fraction))
            roots.update({r: indexed for r in args.recipes if r in prep_recipes.INDEXED})
        for recipe, path in photos.items():  # each with its own bytes' share as cache
            dst = path if args.no_slowstore else os.path.join(store.mount, path.name)
            if not args.no_slowstore and not os.path.exists(dst):
                copy_tree(path, dst)
            roots[recipe] = (str(dst), int(_bytes(path) * args.cache_fraction))
        args.recipes = [*args.recipes, *photos]
        for run in range(0 if args.skip_fetch_bound else args.runs):
            order = configs[run % len(configs) :] + configs[: run % len(configs)]  # spread load drift
            for cfg in order:
                res = _run_child(
                    store, cfg, args, root, args.seed + run, cache_bytes, cache_bytes, args.recipe
                )
                results[cfg].append(res)
                rates = [round(e["items"] / e["time_s"]) for e in res["epochs"]]
                print(f"run {run} ({cfg}) samples/s per epoch {rates}", flush=True)
        if not args.skip_prep_bound:
            prep = run_prep_bound(store, args, roots)
    if args.json:
        args.json.write_text(
            json.dumps({"fetch": results, "prep": prep, "cpu": cpu, "dataset_bytes": dataset_bytes}, indent=1)
        )
    if not args.skip_fetch_bound:
        print_fetch_table(results, dataset_bytes, args, notes)
    for recipe, res in prep.items():
        print_prep_table(res, args, recipe)
    print_recipe_summary(prep, args)


if __name__ == "__main__":
    main()

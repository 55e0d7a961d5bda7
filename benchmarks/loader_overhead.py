"""The loader's own cost per sample: every item cached, a transform that does no work.

    .venv/bin/python benchmarks/loader_overhead.py            # ~3 min on the 2-core VM
    .venv/bin/python benchmarks/loader_overhead.py --rounds 5 --n 2000

What a loader spends per sample beside the prep is what keeps a prep-bound job below the machine's decode
limit (``bench_loader.py``'s prep-bound table). Here the prep is taken away: the transform only takes its
output (a 3x224x224 float32 tensor, written straight into its batch row where the loader lends one, as
coordl's fused transforms do), the items are 500x375 JPEGs of ~90 KB on local disk (the page cache), and
coordl's MinIO cache holds all of them after the first epoch. What is left is the loader: fetching each
item (a cache lookup or a file read), its bookkeeping, stacking the batch and handing it to the main
process. Side by side, in one run, alternating:

(a) ``torch.utils.data.DataLoader`` over ``coordl.ImageFolder`` (each item read from the page cache,
    torch's collate stacks the batch), persistent workers;
(b) ``coordl.DataLoader``, cache 100%, non-persistent workers (torch's default: new workers every epoch);
(c) ``coordl.DataLoader``, cache 100%, persistent workers;
(d) (b) with every new worker checking each cached item's CRC again (``shmem.table._SHARED_MARKS`` off:
    how non-persistent workers read the cache before the rows' shared marks; attribution only).

Rates are samples/s of epochs 2 onwards (median), with the CPU seconds per sample of the main process and
of the workers (``getrusage``, and ``/proc`` for workers still alive); 2 workers, batch 32. Rounds
alternate the configurations; the table shows medians.

``--recipe standard_indexed`` (or another of ``prep_recipes.RECIPES``) runs the same loaders with that
prep instead (on the crop-indexed copy for ``standard_indexed``), every item cached from epoch 2: the
transform's own CPU in the workers is timed per call (``time.thread_time``, summed over the workers in
shared memory), and the table adds what the workers spend **outside the transform** per sample: the
loader's own work with the caches as cold as a real prep leaves them, which the no-op run flatters.
``--photos`` runs every configuration also on the photographic dataset of ``--n`` files (``coordl synth
--photos``), alternated with the synthetic one: a table per dataset.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import prep_recipes
import torch

from coordl.ring.output_buffers import new_output

CONFIGS = {
    "a": "torch DataLoader, persistent workers (page cache)",
    "b": "coordl.DataLoader, cache 100%, non-persistent workers",
    "c": "coordl.DataLoader, cache 100%, persistent workers",
    "d": "(b), every worker checking each item's CRC again (before shared marks)",
}


class TakeRow:
    """A transform that does no work: it returns a fresh output (a lent batch row under coordl's ring).

    It reads no input, so it says it reads buffers as coordl's ``Decode`` does: a cache hit reaches it
    as the view of its row, as a hit reaches coordl's own pipelines (``train_transform``)."""

    reads_buffers = True

    def __call__(self, raw: bytes) -> torch.Tensor:
        return new_output((3, 224, 224), torch.float32)


class TimedTransform:
    """``transform``, its thread CPU time per call added to a shared total (workers are forked children)."""

    def __init__(self, transform, total) -> None:
        self.transform, self.total = transform, total
        self.reads_buffers = getattr(transform, "reads_buffers", False)

    def __call__(self, raw):
        t = time.thread_time_ns()
        out = self.transform(raw)
        spent = time.thread_time_ns() - t
        with self.total.get_lock():
            self.total.value += spent
        return out


def _dir_bytes(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)


def _cpu() -> tuple[float, float]:
    """(this process's CPU s, its workers' CPU s): live workers read from /proc, ended ones from rusage.

    Non-persistent workers end with each epoch (then their time is in ``RUSAGE_CHILDREN``); persistent
    ones live on (read live). Each worker is counted in exactly one of the two at any moment."""
    import psutil

    me = resource.getrusage(resource.RUSAGE_SELF)
    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    live = 0.0
    for kid in psutil.Process().children(recursive=True):
        try:
            t = kid.cpu_times()
        except psutil.NoSuchProcess:
            continue
        live += t.user + t.system
    return me.ru_utime + me.ru_stime, ended.ru_utime + ended.ru_stime + live


def child(cfg: str, root: str, epochs: int, workers: int, recipe: str = "") -> None:
    import multiprocessing as mp

    import coordl
    import shmem.table

    torch.set_num_threads(1)
    if cfg == "d":
        shmem.table._SHARED_MARKS = False
    common = dict(
        batch_size=32, shuffle=True, num_workers=workers, generator=torch.Generator().manual_seed(0)
    )
    spent = mp.get_context("fork").Value("q", 0)  # ns of transform CPU, all processes
    ds = coordl.ImageFolder(
        root, TimedTransform(prep_recipes.make_transform(recipe), spent) if recipe else TakeRow()
    )
    if cfg == "a":
        loader = torch.utils.data.DataLoader(ds, persistent_workers=True, **common)
    else:
        loader = coordl.DataLoader(
            ds, cache_bytes=2 * _dir_bytes(root), persistent_workers=cfg == "c", **common
        )  # fmt: skip
    rows = []
    for _ in range(epochs):
        main0, kids0 = _cpu()
        spent0 = spent.value
        t0, n = time.perf_counter(), 0
        for _images, labels in loader:
            n += len(labels)
        wall = time.perf_counter() - t0
        main1, kids1 = _cpu()
        rows.append((n / wall, (main1 - main0) / n, (kids1 - kids0) / n, (spent.value - spent0) * 1e-9 / n))
    if cfg != "a":
        loader.close()
    later = rows[1:]
    rate = statistics.median(r[0] for r in later)
    main = statistics.median(r[1] for r in later)
    workers_cpu = statistics.median(r[2] for r in later)
    outside = statistics.median(r[2] - r[3] for r in later)  # workers' CPU outside the transform
    print(f"{rate} {main} {workers_cpu} {outside}")


def _run(cfg: str, root: str, epochs: int, workers: int, recipe: str) -> tuple[float, ...]:
    cmd = [sys.executable, __file__, "--child", cfg, "--root", root, "--epochs", str(epochs)]
    out = subprocess.run(
        [*cmd, "--workers", str(workers), "--recipe", recipe], check=True, capture_output=True, text=True
    )
    return tuple(float(x) for x in out.stdout.split()[-4:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", choices=sorted(CONFIGS))
    p.add_argument("--root", default="")
    p.add_argument("--n", type=int, default=2000, help="images (default 2000)")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--configs", default="abcd")
    p.add_argument("--recipe", default="", choices=["", *prep_recipes.RECIPES],
                   help="prep each item with this recipe instead of no work (default: none)")  # fmt: skip
    p.add_argument("--photos", action="store_true",
                   help="also on the photographic dataset of --n files (coordl synth --photos), each config's "
                        "runs alternated with the synthetic ones")  # fmt: skip
    args = p.parse_args()
    if args.child:
        child(args.child, args.root, args.epochs, args.workers, args.recipe)
        return
    from coordl.datasets.synth import make_dataset
    from coordl.prep.cropindex import index_tree

    with tempfile.TemporaryDirectory(
        prefix="loader-overhead-", dir=os.environ.get("COORDL_BENCH_DIR")
    ) as tmp:
        roots = {"synth": str(make_dataset(Path(tmp) / "data", n=args.n, classes=10, seed=0))}
        if args.photos:
            import datakind

            roots["photos"] = str(datakind.photos_root(args.n))
        if args.recipe in prep_recipes.INDEXED:
            for kind, root in roots.items():
                index_tree(root, Path(tmp) / f"{kind}-indexed")
                roots[kind] = str(Path(tmp) / f"{kind}-indexed")
        results = {kind: {c: [] for c in args.configs} for kind in roots}
        for r in range(args.rounds):
            for cfg in args.configs:
                for kind, root in roots.items():
                    results[kind][cfg].append(_run(cfg, root, args.epochs, args.workers, args.recipe))
            for kind, res in results.items():
                print(f"round {r}, {kind}: " + ", ".join(f"({c}) {v[-1][0]:.0f}/s" for c, v in res.items()),
                      flush=True)  # fmt: skip
    for kind, res in results.items():
        _table(args, res, kind)


def _table(
    args: argparse.Namespace, results: dict[str, list[tuple[float, ...]]], kind: str = "synth"
) -> None:
    base = statistics.median(v[0] for v in results[args.configs[0]])
    prep = f"the {args.recipe} recipe" if args.recipe else "a transform that does no work"
    data = "JPEGs" if kind == "synth" else "photographs (coordl synth --photos)"
    print(f"\n### The loader's own cost: {args.n} {data}, {prep}, {args.workers} workers, "
          f"batch 32, epochs 2-{args.epochs}, median of {args.rounds} rounds\n")  # fmt: skip
    extra = " workers outside the transform |" if args.recipe else ""
    print(f"| | samples/s | x ({args.configs[0]}) | main CPU/sample | workers CPU/sample |{extra}")
    print("|---|---|---|---|---|" + ("---|" if args.recipe else ""))
    for cfg, runs in results.items():
        rate = statistics.median(v[0] for v in runs)
        main_us = statistics.median(v[1] for v in runs) * 1e6
        kids_cell = f"{statistics.median(v[2] for v in runs) * 1e6:.0f} us"
        if args.recipe:
            kids_cell += f" | {statistics.median(v[3] for v in runs) * 1e6:.0f} us"
        print(
            f"| ({cfg}) {CONFIGS[cfg]} | {rate:,.0f} | {rate / base:.2f}x | {main_us:.0f} us | {kids_cell} |"
        )


if __name__ == "__main__":
    main()

"""Workers' private memory over one epoch at scale: does it grow with the item count?

A forked loader worker shares its parent's heap copy-on-write; every Python object it touches gets its
reference count written, and the page holding it is copied into the worker (pytorch/pytorch#13246). A file
list held as a Python list of ``(path, label)`` tuples is copied page by page as the epoch reads it: one
copy per worker. This measures that growth: each worker's USS (``psutil``'s ``memory_full_info().uss``)
just after the first batch and again when the epoch's last batch arrives, on a folder of tiny files
(``--size-bytes``, no decode, so the loader's own memory shows):

* ``coordl``: ``coordl.ImageFolder`` under ``coordl.DataLoader``;
* ``imagefolder+torch``: ``coordl.ImageFolder`` under ``torch.utils.data.DataLoader`` (the dataset alone);
* ``list+torch``: a hand-written dataset holding a Python list of ``(path, label)``, under torch's loader
  (what a user writes, and what torch's FAQ warns about);
* ``staged`` (only when asked: ``--configs staged``): ``coordl.ImageFolder(SRC, stage_dir=DST)`` under
  ``coordl.DataLoader`` once every file is staged (``nfs_cache.stage_all`` first: ~1 minute per 10^5 files),
  the reads that look each file up in the stage directory's manifest;
* ``staging`` (only when asked: ``--configs staging``): the same into an empty stage directory (under
  ``$TMPDIR``, made anew for each run): the epoch that stages every file, each worker appending to the manifest
  and reading what the others appended.

    .venv/bin/python benchmarks/scale_memory.py [--items 100000 1000000] [--workers 1 2 4] [--root DIR]

The folders are made once under ``--root`` (default: ``$TMPDIR/coordl-scale-memory``) and reused; 10^6
files take about a minute to write (and ~4 GB of disk blocks at 16 bytes each; ``--size-bytes 0``: none).
:func:`measure_worker_uss_growth` is the reusable measurement (``benchmarks/bench_scale.py`` imports it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil
import torch
import torch.utils.data

__all__ = ["ListDataset", "UssGrowth", "make_tiny_tree", "measure_worker_uss_growth", "no_decode"]

MB = 1 << 20


def no_decode(raw: bytes) -> int:
    """A transform that does no decode: the item's length (module level: picklable for spawned workers)."""
    return len(raw)


class ListDataset(torch.utils.data.Dataset):
    """What a user writes: ``self.items`` a Python list of ``(path, label)``, each item read whole."""

    def __init__(self, root: str) -> None:
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
        self.items = [
            (os.path.join(root, c, name), label)
            for label, c in enumerate(classes)
            for name in sorted(os.listdir(os.path.join(root, c)))
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[int, int]:
        path, label = self.items[index]
        with open(path, "rb") as f:
            return no_decode(f.read()), label


def make_tiny_tree(root: str, n: int, classes: int = 10, size_bytes: int = 16) -> str:
    """``root/class_XX/XXXXXXX.jpg``: ``n`` files of ``size_bytes`` bytes (item ``i`` in class ``i % classes``).

    A marker file records ``(n, classes, size_bytes)``: a complete tree is reused, anything else in ``root``
    raises ``FileExistsError``.
    """
    marker = os.path.join(root, ".tiny-tree")
    want = f"{n} {classes} {size_bytes}\n"
    if os.path.exists(marker):
        with open(marker) as f:
            if f.read() == want:
                return root
        raise FileExistsError(f"{root}: holds another tiny tree (see {marker}); use another --root")
    if os.path.isdir(root) and os.listdir(root):
        raise FileExistsError(f"{root}: not empty and not a tiny tree")
    payload = b"x" * size_bytes
    dirs = [os.path.join(root, f"class_{c:02d}") for c in range(classes)]
    for d in dirs:
        os.makedirs(d, exist_ok=True)
    for i in range(n):
        fd = os.open(
            os.path.join(dirs[i % classes], f"{i:07d}.jpg"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644
        )
        try:
            if payload:
                os.write(fd, payload)
        finally:
            os.close(fd)
    with open(marker, "w") as f:
        f.write(want)
    return root


@dataclass
class UssGrowth:
    """Each worker's USS (bytes) after the first batch and when the last batch arrived."""

    start_bytes: list[int]
    end_bytes: list[int]
    items: int
    epoch_s: float

    @property
    def growth_bytes(self) -> list[int]:
        return [e - s for s, e in zip(self.start_bytes, self.end_bytes, strict=True)]

    @property
    def max_growth_bytes(self) -> int:
        return max(self.growth_bytes)


def _workers_of(me: psutil.Process, before: set[int]) -> list[psutil.Process]:
    """This process's children started since ``before`` that run the loader (not a resource tracker)."""
    out = []
    for child in me.children():
        try:
            cmd = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if child.pid not in before and "resource_tracker" not in cmd and "forkserver" not in cmd:
            out.append(child)
    return out


def _uss(procs: list[psutil.Process]) -> list[int]:
    return [p.memory_full_info().uss for p in procs]


def measure_worker_uss_growth(
    dataset_factory: Callable[[], Any],
    loader_cls: type,
    workers: int,
    *,
    batch_size: int = 256,
    seed: int = 0,
    **loader_kwargs: Any,
) -> UssGrowth:
    """One shuffled epoch of ``loader_cls(dataset_factory(), num_workers=workers, ...)``; each worker's USS
    after the first batch and when the last batch arrives (all items fetched by then).

    Args:
        dataset_factory: builds the dataset in this process (before the workers start).
        loader_cls: ``coordl.DataLoader``, ``torch.utils.data.DataLoader`` or anything with its arguments.
        workers: ``num_workers`` (>= 1: the point is the workers' memory).
        batch_size: items per batch.
        seed: the shuffle's generator seed.
        loader_kwargs: passed on (e.g. ``multiprocessing_context="spawn"``).
    """
    if workers < 1:
        raise ValueError("measure_worker_uss_growth: workers must be >= 1")
    dataset = dataset_factory()
    loader = loader_cls(
        dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
        generator=torch.Generator().manual_seed(seed), **loader_kwargs,
    )  # fmt: skip
    me = psutil.Process()
    before = {c.pid for c in me.children()}
    batches = len(loader)
    t0 = time.perf_counter()
    it = iter(loader)
    next(it)
    procs = _workers_of(me, before)
    if len(procs) != workers:
        raise RuntimeError(
            f"measure_worker_uss_growth: found {len(procs)} worker processes, expected {workers}"
        )
    start = _uss(procs)
    end = start if batches == 1 else []
    for i, _ in enumerate(it, start=1):
        if i == batches - 1:
            end = _uss(procs)
    epoch_s = time.perf_counter() - t0
    del it, loader
    return UssGrowth(start, end, len(dataset), epoch_s)


def _configs(root: str) -> dict[str, Callable[[int], UssGrowth]]:
    import coordl

    def folder() -> Any:
        return coordl.ImageFolder(root, transform=no_decode)

    def staged() -> Any:
        from nfs_cache.bulk import stage_all

        stage_dir = root.rstrip("/") + "-staged"
        stage_all(root, stage_dir, progress=False)  # returns at once when everything is staged
        return coordl.ImageFolder(root, transform=no_decode, stage_dir=stage_dir)

    def staging() -> Any:
        stage_dir = os.path.join(tempfile.gettempdir(), f"coordl-staging-{os.getpid()}")
        shutil.rmtree(stage_dir, ignore_errors=True)  # every file staged again, by this epoch's workers
        return coordl.ImageFolder(root, transform=no_decode, stage_dir=stage_dir)

    return {
        "coordl": lambda w: measure_worker_uss_growth(folder, coordl.DataLoader, w),
        "imagefolder+torch": lambda w: measure_worker_uss_growth(folder, torch.utils.data.DataLoader, w),
        "list+torch": lambda w: measure_worker_uss_growth(
            lambda: ListDataset(root), torch.utils.data.DataLoader, w
        ),
        "staged": lambda w: measure_worker_uss_growth(staged, coordl.DataLoader, w),
        "staging": lambda w: measure_worker_uss_growth(staging, coordl.DataLoader, w),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--workers", type=int, nargs="+", default=[2])
    ap.add_argument("--runs", type=int, default=1, help="alternated runs per cell (the median is shown)")
    ap.add_argument("--size-bytes", type=int, default=16)
    ap.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "coordl-scale-memory"))
    ap.add_argument(
        "--configs", nargs="+", default=["coordl", "imagefolder+torch", "list+torch"],
        choices=["coordl", "imagefolder+torch", "list+torch", "staged", "staging"],
    )  # fmt: skip
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # more workers than cores: meant
    print(f"host: {os.cpu_count()} cores, python {sys.version.split()[0]}, torch {torch.__version__}")
    header = f"{'items':>9} {'workers':>7} " + " ".join(f"{c + ' MB/worker':>28}" for c in args.configs)
    print("per-worker USS growth over one epoch (max over workers; median of runs), epoch seconds in ()")
    print(header)
    for n in args.items:
        t0 = time.perf_counter()
        root = make_tiny_tree(
            os.path.join(args.root, f"n{n}-s{args.size_bytes}"), n, size_bytes=args.size_bytes
        )
        print(f"# tree of {n} files ready in {time.perf_counter() - t0:.1f} s", flush=True)
        configs = _configs(root)
        for w in args.workers:
            cells: dict[str, list[UssGrowth]] = {c: [] for c in args.configs}
            for _ in range(args.runs):
                for c in args.configs:
                    cells[c].append(configs[c](w))
            row = f"{n:>9} {w:>7} "
            for c in args.configs:
                growth = statistics.median(g.max_growth_bytes for g in cells[c]) / MB
                secs = statistics.median(g.epoch_s for g in cells[c])
                row += f"{growth:>20.1f} ({secs:4.1f}s)"
            print(row, flush=True)


if __name__ == "__main__":
    main()

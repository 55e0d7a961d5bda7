"""The loader's own cost per item: tiny items (16-byte payloads, no decode) through torch's DataLoader and
``coordl.DataLoader``, batch 256, 2 persistent workers (issue 59 item 3).

Three datasets a user with small items has, each read by both loaders over the same items:

* ``tensor``: a plain map-style dataset whose ``__getitem__`` returns a 4-int32 tensor (coordl runs it as
  one opaque stage: no cache applies);
* ``source``: a coordl item source (``fetch`` -> 16 bytes from memory, ``prep`` -> the tensor); torch
  reads it through ``__getitem__`` = ``prep(fetch(i))``;
* ``files``: ``coordl.FileListDataset`` over tiny files with a transform that only wraps the bytes (the
  page cache holds them: the read is a few microseconds of system calls).

coordl runs without a cache, with a MinIO cache holding every item (``cache_bytes=``), and with
``generator=`` (torch then runs with the same generator). Beside them, the bound of a loader with no cost
of its own: the dataset's ``__getitem__`` and ``default_collate`` in a loop in one process, times the
worker count (the host's cores allowing). Configurations alternate round by round; the table gives
medians over the rounds, each round's ratio to torch's run of the same round (median and range), and
the CPU per item of the main process and of the workers (summed) over the timed epochs.

    .venv/bin/python benchmarks/bench_item_floor.py [--rounds 5] [--items 100000] [--files 20000]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import psutil
import torch
import torch.utils.data
from torch.utils.data.dataloader import default_collate

import coordl

BATCH = 256
WORKERS = 2
PAYLOAD = 16  # bytes per item


class TinyTensors(torch.utils.data.Dataset):
    """A plain map-style dataset: item i is a tensor of 4 int32."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((PAYLOAD // 4,), i, dtype=torch.int32)


class TinySource(torch.utils.data.Dataset):
    """A coordl item source over one bytes blob in memory; ``__getitem__`` for torch's loader."""

    def __init__(self, n: int) -> None:
        self.blob = b"".join(i.to_bytes(PAYLOAD, "little") for i in range(n))
        self.n = n

    def __len__(self) -> int:
        return self.n

    def fetch(self, i: int) -> bytes:
        return self.blob[i * PAYLOAD : (i + 1) * PAYLOAD]

    def prep(self, raw: Any, i: int) -> torch.Tensor:
        return torch.frombuffer(bytearray(raw), dtype=torch.int32)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.prep(self.fetch(i), i)


def as_tensor(raw: Any) -> torch.Tensor:
    """The files' transform: the bytes as a tensor, nothing decoded."""
    return torch.frombuffer(bytearray(raw), dtype=torch.int32)


def tiny_files(directory: str, n: int) -> coordl.FileListDataset:
    paths = []
    for i in range(n):
        sub = os.path.join(directory, f"{i // 1000:04d}")
        if i % 1000 == 0:
            os.makedirs(sub, exist_ok=True)
        path = os.path.join(sub, f"{i}.bin")
        with open(path, "wb") as f:
            f.write(i.to_bytes(PAYLOAD, "little"))
        paths.append(path)
    return coordl.FileListDataset(paths, targets=[i % 10 for i in range(n)], transform=as_tensor)


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def run_loader(make: Callable[[], Any], epochs: int) -> dict[str, float]:
    """One loader: a warm epoch (workers started, the cache filled), then ``epochs`` timed ones."""
    loader = make()
    try:
        for _ in loader:
            pass
        me = psutil.Process()
        workers = me.children()
        main0, work0 = _cpu(me), sum(_cpu(w) for w in workers)
        items = 0
        start = time.perf_counter()
        for _ in range(epochs):
            for batch in loader:
                first = batch[0] if isinstance(batch, (list, tuple)) else batch
                items += len(first)
        wall = time.perf_counter() - start
        main_cpu, work_cpu = _cpu(me) - main0, sum(_cpu(w) for w in workers) - work0
    finally:
        close = getattr(loader, "close", None)
        if close is not None:
            close()
        else:  # torch's persistent workers stop when the iterator goes
            loader._iterator = None
    return {"rate": items / wall, "main_us": main_cpu / items * 1e6, "workers_us": work_cpu / items * 1e6}


def no_loader_bound(dataset: Any, n_batches: int = 200) -> float:
    """items/s of ``dataset[i]`` + ``default_collate`` in one process, times the worker count."""
    order = torch.randperm(len(dataset)).tolist()
    batches = [order[k * BATCH : (k + 1) * BATCH] for k in range(min(n_batches, len(order) // BATCH))]
    start = time.process_time()
    for batch in batches:
        default_collate([dataset[i] for i in batch])
    return len(batches) * BATCH / (time.process_time() - start) * WORKERS


def _torch(ds: Any, kw: dict[str, Any], gen: bool) -> Callable[[], Any]:
    def make() -> Any:
        extra: dict[str, Any] = {"generator": torch.Generator().manual_seed(0)} if gen else {}
        return torch.utils.data.DataLoader(ds, **kw, **extra)

    return make


def _coordl(ds: Any, kw: dict[str, Any], gen: bool, cached: bool) -> Callable[[], Any]:
    def make() -> Any:
        extra: dict[str, Any] = {"cache_bytes": 256 << 20} if cached else {}
        if gen:
            extra["generator"] = torch.Generator().manual_seed(0)
        return coordl.DataLoader(ds, **kw, **extra)

    return make


def configs(datasets: dict[str, Any]) -> list[tuple[str, str, Callable[[], Any]]]:
    """(dataset, loader label, factory) for every run of a round, torch's first for each dataset."""
    kw: dict[str, Any] = {
        "batch_size": BATCH, "shuffle": True, "num_workers": WORKERS, "persistent_workers": True,
    }  # fmt: skip
    out: list[tuple[str, str, Callable[[], Any]]] = []
    for name, ds in datasets.items():
        caches = [False] if name == "tensor" else [False, True]  # a plain dataset has no bytes to cache
        for gen in (False, True):
            g = " +generator" if gen else ""
            out.append((name, f"torch{g}", _torch(ds, kw, gen)))
            for cached in caches:
                out.append((name, f"coordl{' +cache' if cached else ''}{g}", _coordl(ds, kw, gen, cached)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="alternated rounds (default 5)")
    ap.add_argument(
        "--items", type=int, default=100_000, help="items of the in-memory datasets (default 100000)"
    )
    ap.add_argument("--files", type=int, default=20_000, help="tiny files (default 20000; 0: skip)")
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs per run (default 2)")
    ap.add_argument("--only", nargs="*", default=None, help="datasets to run (tensor, source, files)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message=".*opaque stage.*")
    warnings.filterwarnings("ignore", message=".*no fetch/prep split.*")
    tmp = tempfile.TemporaryDirectory(prefix="coordl-item-floor-")
    datasets: dict[str, Any] = {"tensor": TinyTensors(args.items), "source": TinySource(args.items)}
    if args.files:
        datasets["files"] = tiny_files(tmp.name, args.files)
    if args.only:
        datasets = {k: v for k, v in datasets.items() if k in args.only}
    runs = configs(datasets)
    results: dict[tuple[str, str], list[dict[str, float]]] = {(d, label): [] for d, label, _ in runs}
    bounds: dict[str, list[float]] = {d: [] for d in datasets}
    epochs = {d: args.epochs * (max(1, args.items // args.files) if d == "files" else 1) for d in datasets}
    for r in range(args.rounds):
        for d, label, make in runs:
            results[(d, label)].append(run_loader(make, epochs[d]))
        for d, ds in datasets.items():
            bounds[d].append(no_loader_bound(ds))
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    print(
        f"\nTiny items ({PAYLOAD} B, batch {BATCH}, {WORKERS} persistent workers), {args.rounds} alternated rounds; "
        f"{platform.processor() or platform.machine()}, {psutil.cpu_count()} cores, torch {torch.__version__}\n"
    )
    header = "| dataset | loader | items/s (median) | range | ratio to torch (median, range) | CPU us/item main | workers |"
    print(header)
    print("|---|---|---|---|---|---|---|")
    for (d, label), rs in results.items():
        base_label = "torch +generator" if "generator" in label else "torch"
        base = results[(d, base_label)]
        rates = [x["rate"] for x in rs]
        ratios = [x["rate"] / b["rate"] for x, b in zip(rs, base, strict=True)]
        print(
            f"| {d} | {label} | {statistics.median(rates) / 1e3:.0f}k | {min(rates) / 1e3:.0f}-{max(rates) / 1e3:.0f}k | "
            f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | "
            f"{statistics.median(x['main_us'] for x in rs):.2f} | {statistics.median(x['workers_us'] for x in rs):.2f} |"
        )
    for d, b in bounds.items():
        print(f"| {d} | no loader cost (getitem + collate in one process x {WORKERS}) | {statistics.median(b) / 1e3:.0f}k | "
              f"{min(b) / 1e3:.0f}-{max(b) / 1e3:.0f}k | | | |")  # fmt: skip
    tmp.cleanup()


if __name__ == "__main__":
    main()

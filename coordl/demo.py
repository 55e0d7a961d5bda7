"""``coordl demo``: torch's DataLoader vs coordl's on the same data, slow storage, 3 epochs.

What it does, on a fresh machine with no download:

1. writes a synthetic ImageFolder dataset (1000 JPEGs of 500x375, ~90 KB each) under the cache
   directory (``$COORDL_CACHE_DIR`` or ``~/.cache/coordl``; instant on the second run);
2. puts it behind *simulated* slow storage: every file read holds a lock shared by all worker
   processes for ``bytes / bandwidth`` seconds, i.e. one storage link of ``--storage-mb-s`` MB/s
   with no page cache in front (like an NFS share or an object store). The benchmark
   ``benchmarks/bench_loader.py`` does the same with a real throttled block device;
3. runs ``torch.utils.data.DataLoader`` and ``coordl.DataLoader(cache_bytes=50% of the dataset)``
   with the same dataset, transform, batch size and workers for 3 epochs each, and prints samples/s,
   cache hit ratio and bytes read from storage per epoch, then ``loader.stats()``.

Expected: both read everything in epoch 1; from epoch 2 coordl serves half the items from its
cache (hit ratio 0.50), reads half the bytes, and runs faster while storage is the bottleneck.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from coordl.datasets.files import ImageFolder
from shmem.segment import flock_timeout

__all__ = ["ThrottledImageFolder", "run_demo", "add_parser"]

LOCK_TIMEOUT_S = 60.0


def default_cache_dir() -> Path:
    """Where the demo keeps its dataset: ``$COORDL_CACHE_DIR`` or ``~/.cache/coordl``."""
    return Path(os.environ.get("COORDL_CACHE_DIR") or Path.home() / ".cache" / "coordl")


class ThrottledImageFolder(ImageFolder):
    """An ImageFolder whose reads share one simulated storage link of ``bandwidth_bytes_per_s``.

    A read takes the link (an flock on ``lock_path``, shared by every process that reads the
    dataset, fork or spawn), holds it for ``len(bytes) / bandwidth`` seconds, then releases it:
    reads from all workers queue as on one slow device. Simulated, so the page cache cannot hide it.
    """

    def __init__(
        self, root: str | os.PathLike, transform: Any, bandwidth_bytes_per_s: float, lock_path: str
    ) -> None:
        super().__init__(root, transform)
        if bandwidth_bytes_per_s <= 0:
            raise ValueError(f"ThrottledImageFolder: bandwidth must be positive, got {bandwidth_bytes_per_s}")
        self.bandwidth_bytes_per_s = float(bandwidth_bytes_per_s)
        self.lock_path = lock_path

    def _read(self, index: int, cached: bool = True) -> bytes:
        data = super()._read(index, cached)
        with open(self.lock_path, "a+b") as lock:
            flock_timeout(lock.fileno(), LOCK_TIMEOUT_S, f"lock on simulated storage link {self.lock_path}")
            try:
                time.sleep(len(data) / self.bandwidth_bytes_per_s)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        return data


def _run_epochs(loader: Any, epochs: int, name: str, progress: bool) -> list[float]:
    from nfs_cache.progress import Progress

    rates = []
    total = len(loader.dataset)
    for e in range(epochs):
        start, n = time.perf_counter(), 0
        with Progress(total, f"{name}, epoch {e + 1}/{epochs}", unit="samples", enabled=progress) as bar:
            for _images, labels in loader:
                n += len(labels)
                bar.update(len(labels))
        rates.append(n / (time.perf_counter() - start))
    return rates


def run_demo(
    root: Path,
    n: int,
    storage_mb_s: float,
    workers: int,
    batch_size: int,
    epochs: int,
    progress: bool = False,
) -> dict[str, dict[str, Any]]:
    """Run both loaders; return {name: {"rates": [...], "epochs": [per-epoch stats], "stats": {...}}}.

    ``progress``: show each epoch's progress on stderr (a minute of silence otherwise).
    """
    import torch

    import coordl
    from coordl.datasets import synth
    from coordl.prep.transforms import train_transform

    synth.make_dataset(root, n=n, classes=10, seed=0, progress=progress)
    dataset_bytes = sum(p.stat().st_size for p in root.glob("class_*/*.jpg"))
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="coordl-demo-") as tmp:
        ds = ThrottledImageFolder(
            root, train_transform(224), storage_mb_s * 1e6, os.path.join(tmp, "link.lock")
        )
        torch.manual_seed(0)
        # (torch's annotation names Dataset; its loader takes any object with __getitem__ and __len__)
        base: torch.utils.data.DataLoader = torch.utils.data.DataLoader(
            ds,  # type: ignore[arg-type]
            batch_size=batch_size,
            shuffle=True,
            num_workers=workers,
        )
        # torch's loader counts nothing: every item is read from storage every epoch.
        rates = _run_epochs(base, epochs, "torch.utils.data.DataLoader", progress)
        per_epoch = [{"hit_ratio": 0.0, "storage_bytes_read": dataset_bytes} for _ in rates]
        results["torch"] = {"rates": rates, "epochs": per_epoch, "stats": {}}
        torch.manual_seed(0)
        with coordl.DataLoader(
            ds, batch_size=batch_size, shuffle=True, num_workers=workers, cache_bytes=dataset_bytes // 2
        ) as loader:
            rates = _run_epochs(loader, epochs, "coordl.DataLoader, cache 50%", progress)
            results["coordl, cache 50%"] = {
                "rates": rates,
                "epochs": loader.epoch_stats(),
                "stats": loader.stats(),
            }
    results["_meta"] = {"dataset_bytes": dataset_bytes, "n": n}
    return results


def _print(results: dict[str, dict[str, Any]], storage_mb_s: float, workers: int) -> None:
    from rich.console import Console
    from rich.table import Table

    meta = results.pop("_meta")
    console = Console()
    table = Table(
        title=f"torch.utils.data.DataLoader vs coordl.DataLoader: {meta['n']} images, "
        f"{meta['dataset_bytes'] / 1e6:.0f} MB, storage {storage_mb_s:g} MB/s (simulated), {workers} workers"
    )
    table.add_column("loader", no_wrap=True)
    table.add_column("epoch", justify="right")
    table.add_column("samples/s", justify="right")
    table.add_column("vs torch", justify="right")
    table.add_column("hit ratio", justify="right")
    table.add_column("storage MB", justify="right")
    base_rates = next(iter(results.values()))["rates"]
    for name, res in results.items():
        for e, (rate, ep) in enumerate(zip(res["rates"], res["epochs"], strict=True)):
            table.add_row(
                name if e == 0 else "",
                str(e + 1),
                f"{rate:.0f}",
                f"{rate / base_rates[e]:.2f}x",
                f"{ep['hit_ratio']:.2f}",
                f"{ep['storage_bytes_read'] / 1e6:.1f}",
            )
    console.print(table)
    stats = results["coordl, cache 50%"]["stats"]
    console.print("coordl loader.stats():", stats)


def _run(args: argparse.Namespace) -> int:
    root = Path(args.root) if args.root else default_cache_dir() / f"demo-synth-{args.n}"
    print(f"dataset: {root} (synthesised on first use)", flush=True)
    print(
        f"running torch.utils.data.DataLoader, then coordl.DataLoader, {args.epochs} epochs each over "
        f"{args.n} images on simulated {args.storage_mb_s:g} MB/s storage (about a minute)",
        flush=True,
    )
    try:
        results = run_demo(
            root, args.n, args.storage_mb_s, args.workers, args.batch_size, args.epochs, progress=True
        )
    except (FileExistsError, NotADirectoryError) as e:  # the dataset directory is in the way
        raise ValueError(f"argument --root: {e}") from e
    _print(results, args.storage_mb_s, args.workers)
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``coordl demo``."""
    from coordl.argtypes import nonnegative_int, positive_float, positive_int

    p = subparsers.add_parser(
        "demo", help="torch DataLoader vs coordl.DataLoader on synthetic data, slow storage"
    )
    p.add_argument("--root", default=None, help="dataset directory (default: ~/.cache/coordl/demo-synth-N)")
    p.add_argument("--n", type=positive_int, default=1000, help="images to synthesise (default 1000)")
    p.add_argument(
        "--storage-mb-s",
        type=positive_float,
        default=10.0,
        help="simulated storage bandwidth, MB/s (default 10: slower than prep on 2 cores, so fetch-bound)",
    )
    p.add_argument(
        "--workers",
        type=nonnegative_int,
        default=os.cpu_count() or 2,
        help="loader worker processes (default: cores; 0 loads in the main process)",
    )
    p.add_argument("--batch-size", type=positive_int, default=32, help="batch size (default 32)")
    p.add_argument("--epochs", type=positive_int, default=3, help="epochs per loader (default 3)")
    p.set_defaults(func=_run)

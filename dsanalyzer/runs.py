"""The differential runs: what each run changes in a loader before it is timed.

DS-Analyzer's method: run the same job several times, each time removing one source of stall, and
read each stall off as the difference between two runs.

``compute``       one real batch, replayed from memory every iteration: only the step is left.
``prep_scaling``  the loader alone (no step), raw items from memory, at k = 1..cores workers:
                  the prep pipeline's capacity and how it scales with cores. Also measures the cold
                  fetch rate and the dataset's size.
``prep``          the full job with raw items from memory: compute + prep stall.
``real``          the full job starting from a cold page cache: compute + prep stall + fetch stall.

Serving raw items from memory: for a coordl item source (``fetch``) the source's ``fetch`` is
replaced by a lookup in a dict filled before timing; for anything that reads files the files are
read into the page cache first and their residency checked with ``mincore``. Limit: when the data
do not fit the memory budget, a source's uncached items are substituted by cached ones (same
dataset, same prep, different item), and a file dataset is only partly resident (the report says
how much).

Every function here works on a loader object and an ``open_iter`` callable, so the same code serves
the import hook (an unmodified script) and the Python API.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

from coordl.source import is_item_source
from dsanalyzer import fetchrate

__all__ = [
    "MODES",
    "MemoryFetch",
    "ReplayIterator",
    "find_item_source",
    "loader_files",
    "set_workers",
    "shutdown_iterator",
    "take_one_batch",
    "serve_from_memory",
    "restore_fetch",
    "start_cold",
    "measure_prep_scaling",
    "batch_items",
    "dataset_info",
]

MODES = ("prep_scaling", "compute", "prep", "real")


def batch_items(batch: Any, default: int = 1) -> int:
    """Samples in a batch: the leading dimension of its first tensor/array, found recursively."""
    for _ in range(4):
        shape = getattr(batch, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
        if isinstance(batch, dict) and batch:
            batch = next(iter(batch.values()))
        elif isinstance(batch, (list, tuple)) and batch:
            if not hasattr(batch[0], "shape") and not isinstance(batch[0], (list, tuple, dict)):
                return len(batch)
            batch = batch[0]
        else:
            break
    return default


def _unwrap(obj: Any) -> list[Any]:
    chain = []
    for _ in range(8):
        if obj is None or obj in chain:
            break
        chain.append(obj)
        obj = getattr(obj, "dataset", None) or getattr(obj, "source", None)
    return chain


def find_item_source(loader: Any) -> Any | None:
    """The coordl item source (``fetch``/``prep``) behind a loader, if any."""
    for start in (getattr(loader, "source", None), getattr(loader, "dataset", None)):
        for obj in _unwrap(start):
            if is_item_source(obj):
                return obj
    return None


def loader_files(loader: Any, data_path: str | None = None) -> list[str]:
    """Files the loader's dataset reads; ``data_path`` (a file or directory) when given."""
    if data_path:
        return fetchrate.files_under(data_path)
    for start in (getattr(loader, "dataset", None), getattr(loader, "source", None)):
        files = fetchrate.dataset_files(start) if start is not None else []
        if files:
            return files
    return []


def dataset_info(loader: Any, files: list[str]) -> dict:
    """Items, bytes, average item bytes and the data's root path (common directory of its files)."""
    dataset = getattr(loader, "dataset", None)
    try:
        items = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        items = len(files)
    total = 0
    for path in files:
        try:
            total += os.path.getsize(path)
        except OSError:
            pass
    path = os.path.abspath(os.path.commonpath(files)) if files else None
    return {
        "items": int(items),
        "bytes": int(total),
        "avg_item_bytes": (total / len(files)) if files else 0.0,
        "path": path,
    }


def set_workers(loader: Any, workers: int) -> None:
    """Change a loader's worker count between iterators (torch allows it; prefetch needs a value).

    A ``coordl.DataLoader`` builds a torch loader inside (``_torch``): that one is changed.
    """
    target = loader.__dict__.get("_torch") or loader
    target.num_workers = workers
    if workers > 0 and getattr(target, "prefetch_factor", 2) is None:
        target.prefetch_factor = 2


def shutdown_iterator(it: Any) -> None:
    """Stop an iterator's worker processes now rather than at garbage collection."""
    stop = getattr(it, "_shutdown_workers", None)
    if callable(stop):
        stop()


class ReplayIterator:
    """Hands out the same batch forever: the compute run's data path costs nothing."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def __iter__(self) -> ReplayIterator:
        return self

    def __next__(self) -> Any:
        return self.batch


def take_one_batch(loader: Any, open_iter: Callable[[], Iterator]) -> Any:
    """One real batch, prepared in this process (no worker start-up), workers restored after."""
    workers = getattr(loader, "num_workers", 0)
    set_workers(loader, 0)
    try:
        it = open_iter()
        try:
            return next(it)
        except StopIteration:
            raise RuntimeError(
                f"the loader ({type(loader).__name__}) yielded no batches: nothing to profile"
            ) from None
        finally:
            shutdown_iterator(it)
    finally:
        set_workers(loader, workers)


class MemoryFetch:
    """A ``fetch`` that returns raw bytes from a dict; missing indices get a cached item instead."""

    def __init__(self, items: dict[int, bytes]) -> None:
        self.items = items
        self.keys = sorted(items)

    def __call__(self, index: int) -> bytes:
        raw = self.items.get(index)
        if raw is None:
            raw = self.items[self.keys[index % len(self.keys)]]
        return raw


def restore_fetch(loader: Any) -> None:
    """Undo :func:`serve_from_memory` on an item source (the class's own ``fetch`` again)."""
    source = find_item_source(loader)
    if source is not None and isinstance(getattr(source, "__dict__", {}).get("fetch"), MemoryFetch):
        del source.fetch


def serve_from_memory(
    loader: Any, needed_items: int, budget_bytes: int, data_path: str | None = None
) -> dict:
    """Make the loader's raw reads come from memory; returns how (for the report)."""
    source = find_item_source(loader)
    if source is not None and not data_path:
        n = len(source)
        order = list(range(n))
        random.Random(0).shuffle(order)
        items: dict[int, bytes] = {}
        used = 0
        for i in order[: max(1, min(n, needed_items))]:
            raw = source.fetch(i)
            if items and used + len(raw) > budget_bytes:
                break
            items[i] = bytes(raw)
            used += len(raw)
        try:
            source.fetch = MemoryFetch(items)
        except (AttributeError, TypeError):
            source = None  # a class with __slots__: fall back to the page cache
        else:
            return {
                "method": "source.fetch from a dict",
                "items": len(items),
                "bytes": used,
                "resident_fraction": len(items) / n if n else 1.0,
            }
    files = loader_files(loader, data_path)
    if not files:
        return {
            "method": "none: no item source and no files found",
            "items": 0,
            "bytes": 0,
            "resident_fraction": 0.0,
        }
    order = list(files)
    if sum(_size(p) for p in files) > budget_bytes:
        random.Random(0).shuffle(order)
    n_files, n_bytes = fetchrate.warm_files(order, budget_bytes)
    warmed = order[:n_files]
    resident = fetchrate.resident_fraction(warmed) * (n_files / len(files))
    return {
        "method": "files read into the page cache",
        "items": n_files,
        "bytes": n_bytes,
        "resident_fraction": resident,
    }


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def start_cold(loader: Any, data_path: str | None = None) -> dict:
    """Drop the loader's files from the page cache so the real run reads storage."""
    files = loader_files(loader, data_path)
    evicted = fetchrate.evict_files(files)
    return {
        "files": len(files),
        "evicted": evicted,
        "resident_fraction_after": fetchrate.resident_fraction(files[:200]) if files else None,
    }


def _loader_alone_rate(
    loader: Any, open_iter: Callable[[], Iterator], iters: int, warmup: int, tick: Callable[[], None]
) -> float:
    """Samples/s of pulling batches as fast as possible, after ``warmup`` batches."""
    it = open_iter()
    samples = 0
    t0 = time.perf_counter()
    try:
        for i in range(warmup + iters):
            if i == warmup:
                t0 = time.perf_counter()
                samples = 0
            try:
                batch = next(it)
            except StopIteration:
                shutdown_iterator(it)
                it = open_iter()
                batch = next(it, None)
                if batch is None:
                    raise RuntimeError(f"the loader ({type(loader).__name__}) yielded no batches") from None
            samples += batch_items(batch, getattr(loader, "batch_size", None) or 1)
            tick()
    finally:
        shutdown_iterator(it)
    elapsed = time.perf_counter() - t0
    return samples / elapsed if elapsed > 0 else float("inf")


def measure_prep_scaling(
    loader: Any,
    open_iter: Callable[[], Iterator],
    workers_list: list[int],
    iters: int,
    warmup: int,
    progress: Callable[[int], None] | None = None,
) -> dict:
    """Samples/s of the loader alone (no step) at each worker count; epochs restart as needed.

    A worker count the loader cannot run (a loader that sized per-worker state for its own count)
    is left out and noted under ``skipped``; the loader's own count must work.
    """
    original = int(getattr(loader, "num_workers", 0) or 0)
    done = [0]

    def tick() -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0])

    ks, rates, skipped = [], [], {}
    try:
        for k in workers_list:
            set_workers(loader, k)
            try:
                rates.append(_loader_alone_rate(loader, open_iter, iters, warmup, tick))
            except Exception as e:
                if k == original:
                    raise
                skipped[str(k)] = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
                continue
            ks.append(k)
    finally:
        set_workers(loader, original)
    out: dict = {"workers": ks, "samples_per_s": rates}
    if skipped:
        out["skipped"] = skipped
    return out

"""The differential runs: what each run changes in a loader before it is timed.

DS-Analyzer's method: run the same job several times, each time removing one source of stall, and
read each stall off as the difference between two runs.

``compute``       one real batch, replayed from memory every iteration: only the step is left.
``prep_scaling``  the loader alone (no step), raw items from memory, at k = 1..cores workers:
                  the prep pipeline's capacity and how it scales with cores. Also measures the cold
                  fetch rate and the dataset's size.
``prep``          the full job with raw items from memory: compute + prep stall.
``real``          the full job starting from a cold page cache: compute + prep stall + fetch stall.

Serving raw items from memory: a ``coordl.DataLoader`` gets a :class:`MemoryTier` through its public
``add_fetch_tier`` (asked before every other tier); a plain torch loader over a coordl item source
gets the source's ``fetch`` replaced by a dict lookup (torch has no fetch hook); anything else that
reads files has its files read into the page cache first, residency checked with ``mincore``. Limit:
when the data do not fit the memory budget, uncached items are substituted by cached ones (same
dataset, same prep, different item), and a file dataset is only partly resident (the report says
how much).

coordl is optional: it is imported only when the loader or its dataset is a coordl object (then it
is already loaded). Every function works on a loader object and an ``open_iter`` callable, so the
same code serves the import hook (an unmodified script) and the Python API
(:mod:`dsanalyzer.measure.modes` composes them).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

from dsanalyzer.measure import fetchrate

__all__ = [
    "MemoryFetch",
    "MemoryTier",
    "is_coordl_loader",
    "ReplayIterator",
    "find_item_source",
    "loader_files",
    "data_files",
    "files_bytes",
    "traced_files",
    "set_workers",
    "shutdown_iterator",
    "take_one_batch",
    "serve_from_memory",
    "start_cold",
    "measure_prep_scaling",
    "loader_alone_rate",
    "batch_items",
    "dataset_info",
]


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


def _is_item_source(obj: Any) -> bool:
    # The item-source protocol (coordl.data.source.ItemSource) is duck-typed: a source need not come
    # from coordl, so the check is structural and never imports coordl.
    return all(callable(getattr(obj, name, None)) for name in ("__len__", "fetch", "prep"))


def is_coordl_loader(loader: Any) -> bool:
    """True for a ``coordl.DataLoader`` (coordl is imported only when the object comes from it)."""
    if type(loader).__module__.partition(".")[0] != "coordl":
        return False
    from coordl.dataloader import DataLoader

    return isinstance(loader, DataLoader)


def find_item_source(loader: Any) -> Any | None:
    """The coordl item source (``fetch``/``prep``) behind a loader, if any."""
    for start in (getattr(loader, "source", None), getattr(loader, "dataset", None)):
        for obj in _unwrap(start):
            if _is_item_source(obj):
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


_TRACED: dict[int, dict] = {}


def traced_files(loader: Any) -> dict:
    """What :func:`dsanalyzer.measure.itemsize.trace_item_files` found for the loader's dataset (cached)."""
    from dsanalyzer.measure import itemsize

    dataset = getattr(loader, "dataset", None)
    if dataset is None:
        return {}
    if id(dataset) not in _TRACED:
        _TRACED[id(dataset)] = itemsize.trace_item_files(dataset)
    return _TRACED[id(dataset)]


def data_files(loader: Any, data_path: str | None = None) -> list[str]:
    """:func:`loader_files`, else the files the dataset was seen opening."""
    return loader_files(loader, data_path) or list(traced_files(loader).get("files") or [])


def dataset_info(loader: Any, files: list[str]) -> dict:
    """Items, bytes, average item bytes and the data's root path (common directory of its files)."""
    dataset = getattr(loader, "dataset", None)
    try:
        items = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        items = len(files)
    total = files_bytes(files)
    path = os.path.abspath(os.path.commonpath(files)) if files else None
    return {
        "items": int(items),
        "bytes": int(total),
        "avg_item_bytes": (total / len(files)) if files else 0.0,
        "path": path,
    }


def set_workers(loader: Any, workers: int) -> None:
    """Change a loader's worker count between iterators.

    torch's ``num_workers`` is a plain attribute (prefetch then needs a value); coordl's is a public
    property that takes effect at the next ``iter``.
    """
    loader.num_workers = workers
    if not is_coordl_loader(loader) and workers > 0 and getattr(loader, "prefetch_factor", 2) is None:
        loader.prefetch_factor = 2


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


class MemoryTier:
    """A coordl fetch tier (``coordl.fetch.pipeline.FetchTier``) answering every read from a dict."""

    name = "dsanalyzer-memory"
    in_memory = True

    def __init__(self, items: dict[int, bytes]) -> None:
        self._fetch = MemoryFetch(items)
        self.hits = 0

    def get(self, index: int) -> bytes:
        self.hits += 1
        return self._fetch(index)

    def offer(self, index: int, raw: bytes | memoryview) -> None:
        """Every read hits: nothing is ever offered."""

    def stats(self) -> dict[str, int]:
        return {"dsanalyzer_memory_hits": self.hits}


def _items_from(source: Any, needed_items: int, budget_bytes: int) -> dict[int, bytes]:
    """Raw bytes of up to ``needed_items`` random items, within ``budget_bytes``."""
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
    return items


def _memory_info(method: str, items: dict[int, bytes], n: int) -> dict:
    return {
        "method": method,
        "items": len(items),
        "bytes": sum(len(v) for v in items.values()),
        "resident_fraction": len(items) / n if n else 1.0,
    }


def serve_from_memory(
    loader: Any, needed_items: int, budget_bytes: int, data_path: str | None = None
) -> tuple[dict, Callable[[], None]]:
    """Make the loader's raw reads come from memory; returns how (for the report) and the undo."""
    source = find_item_source(loader)
    if source is not None and not data_path:
        items = _items_from(source, needed_items, budget_bytes)
        if is_coordl_loader(loader) and getattr(loader, "source", None) is not None:
            tier = MemoryTier(items)
            loader.add_fetch_tier(tier)
            info = _memory_info("coordl fetch tier from a dict", items, len(source))
            return info, lambda: loader.remove_fetch_tier(tier)
        try:
            source.fetch = MemoryFetch(items)
        except (AttributeError, TypeError):
            pass  # a class with __slots__: fall back to the page cache
        else:
            return _memory_info("source.fetch from a dict", items, len(source)), lambda: _restore_fetch(
                source
            )
    files = data_files(loader, data_path)
    if not files:
        info = {"method": "none: no item source and no files found", "items": 0, "bytes": 0}
        return {**info, "resident_fraction": 0.0}, lambda: None
    order = list(files)
    if files_bytes(files) > budget_bytes:
        random.Random(0).shuffle(order)
    n_files, n_bytes = fetchrate.warm_files(order, budget_bytes)
    resident = fetchrate.resident_fraction(order[:n_files]) * (n_files / len(files))
    info = {"method": "files read into the page cache", "items": n_files, "bytes": n_bytes}
    return {**info, "resident_fraction": resident}, lambda: None


def _restore_fetch(source: Any) -> None:
    """Undo the ``fetch`` replacement (the class's own ``fetch`` again)."""
    if isinstance(getattr(source, "__dict__", {}).get("fetch"), MemoryFetch):
        del source.fetch


def files_bytes(files: list[str]) -> int:
    """The total size of ``files`` (a file that vanished counts 0)."""
    total = 0
    for path in files:
        try:
            total += os.path.getsize(path)
        except OSError:
            pass
    return total


def start_cold(loader: Any, data_path: str | None = None, files: list[str] | None = None) -> dict:
    """Drop the loader's files (or ``files``, when given) from the page cache so the real run reads storage."""
    files = data_files(loader, data_path) if files is None else files
    evicted = fetchrate.evict_files(files)
    return {
        "files": len(files),
        "evicted": evicted,
        "resident_fraction_after": fetchrate.resident_fraction(files[:200]) if files else None,
    }


def loader_alone_rate(
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
                rates.append(loader_alone_rate(loader, open_iter, iters, warmup, tick))
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

"""Where a DataLoader's items come from, and serving them from memory for the prep run.

The files a loader's dataset reads (``--data``, a dataset that lists them, or the files it was seen
opening: :mod:`dsanalyzer.measure.itemsize`), the coordl item source (``fetch``/``prep``) behind it
if any, and :func:`serve_from_memory`: a ``coordl.DataLoader`` gets a memory fetch tier
(:mod:`dsanalyzer.jobs.coordl_loader`); a plain torch loader over a coordl item source gets the
source's ``fetch`` replaced by a dict lookup (torch has no fetch hook); anything else that reads files
has its files read into the page cache first, residency checked with ``mincore``. Limit: when the
data do not fit the memory budget, uncached items are substituted by cached ones (same dataset, same
prep, different item), and a file dataset is only partly resident (the report says how much).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Any

from dsanalyzer.jobs import coordl_loader
from dsanalyzer.measure import fetchrate, prepspread, runs

__all__ = [
    "MemoryFetch",
    "find_item_source",
    "loader_files",
    "traced_files",
    "data_files",
    "dataset_info",
    "serve_from_memory",
    "start_cold",
    "prep_spread",
]


def _unwrap(obj: Any) -> list[Any]:
    chain = []
    for _ in range(8):
        if obj is None or obj in chain:
            break
        chain.append(obj)
        obj = getattr(obj, "dataset", None) or getattr(obj, "source", None)
    return chain


def _is_item_source(obj: Any) -> bool:
    # The item-source protocol (coordl.datasets.source.ItemSource) is duck-typed: a source need not come
    # from coordl, so the check is structural and never imports coordl.
    return all(callable(getattr(obj, name, None)) for name in ("__len__", "fetch", "prep"))


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
    from dsanalyzer.measure import itemsize  # here: it is loaded only for a dataset that lists no files

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
    total = runs.files_bytes(files)
    path = os.path.abspath(os.path.commonpath(files)) if files else None
    return {
        "items": int(items),
        "bytes": int(total),
        "avg_item_bytes": (total / len(files)) if files else 0.0,
        "path": path,
    }


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
        undo = coordl_loader.serve_tier(loader, MemoryFetch(items))
        if undo is not None:
            return _memory_info("coordl fetch tier from a dict", items, len(source)), undo
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
    if runs.files_bytes(files) > budget_bytes:
        random.Random(0).shuffle(order)
    n_files, n_bytes = fetchrate.warm_files(order, budget_bytes)
    resident = fetchrate.resident_fraction(order[:n_files]) * (n_files / len(files))
    info = {"method": "files read into the page cache", "items": n_files, "bytes": n_bytes}
    return {**info, "resident_fraction": resident}, lambda: None


def _restore_fetch(source: Any) -> None:
    """Undo the ``fetch`` replacement (the class's own ``fetch`` again)."""
    if isinstance(getattr(source, "__dict__", {}).get("fetch"), MemoryFetch):
        del source.fetch


def start_cold(loader: Any, data_path: str | None = None) -> dict:
    """Drop the loader's files from the page cache so the real run reads storage."""
    return runs.evict_cold(data_files(loader, data_path))


def prep_spread(loader: Any) -> dict:
    """The spread of per-sample prep times (:mod:`dsanalyzer.measure.prepspread`): a coordl item source's
    ``prep`` (its ``fetch`` untimed), else ``dataset[i]`` of a map-style dataset (its read included)."""
    source = find_item_source(loader)
    if source is not None:
        return prepspread.measure_prep_spread(len(source), source.prep, source.fetch)
    dataset = getattr(loader, "dataset", None)
    if dataset is None or any(c.__name__ == "IterableDataset" for c in type(dataset).__mro__):
        return {"error": "not a map-style dataset (no dataset[i] to time)"}
    try:
        items = len(dataset)
    except TypeError:
        return {"error": f"the dataset ({type(dataset).__qualname__}) has no len()"}
    return prepspread.measure_prep_spread(items, lambda _raw, i: dataset[i])

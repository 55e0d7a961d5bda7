"""Raw storage read rate with a cold cache, and the page-cache controls the differential runs need.

* ``dataset_files(dataset)`` finds the files behind a dataset (torchvision-style ``.samples``, file
  lists, a coordl source whose ``describe(i)`` is a path, wrappers such as ``Subset``).
* ``evict_files`` drops them from the page cache with ``posix_fadvise(DONTNEED)``: per file, no root,
  no machine-wide ``drop_caches``.
* ``warm_files`` reads them into the page cache and ``resident_fraction`` checks with ``mincore``
  that they stayed there.
* ``measure_fetch_rate`` reads a random sample of items cold (bytes/s and items/s) with as many
  reader threads as the loader has workers, because that is how the loader reads.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import random
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = [
    "dataset_files",
    "files_under",
    "evict_files",
    "warm_files",
    "resident_fraction",
    "measure_fetch_rate",
]

_LIST_ATTRS = ("samples", "imgs", "files", "paths", "file_list", "filenames")


def files_under(root: str) -> list[str]:
    """Every regular file below ``root`` (or ``[root]`` when it is a file), sorted."""
    if os.path.isfile(root):
        return [root]
    out: list[str] = []
    for dirpath, _dirs, names in os.walk(root):
        out.extend(os.path.join(dirpath, n) for n in names)
    return sorted(p for p in out if os.path.isfile(p))


def dataset_files(dataset: object, limit: int | None = None) -> list[str]:
    """Paths of the files a dataset reads, or ``[]`` when they cannot be found out."""
    for _ in range(8):  # unwrap Subset/ConcatDataset-like wrappers
        for attr in _LIST_ATTRS:
            entries = getattr(dataset, attr, None)
            if isinstance(entries, (list, tuple)) and entries:
                first = entries[0]
                if isinstance(first, (tuple, list)):
                    paths = [str(e[0]) for e in entries]
                else:
                    paths = [str(e) for e in entries]
                if os.path.isfile(paths[0]):
                    return paths[:limit] if limit else paths
        describe = getattr(dataset, "describe", None)
        if callable(describe):
            try:
                n = len(dataset)  # type: ignore[arg-type]
                if n and os.path.isfile(str(describe(0))):
                    n = min(n, limit) if limit else n
                    return [str(describe(i)) for i in range(n)]
            except Exception:  # a describe that fails is not a file list
                pass
        inner = getattr(dataset, "dataset", None) or getattr(dataset, "source", None)
        if inner is None or inner is dataset:
            break
        dataset = inner
    return []


def evict_files(paths: Iterable[str]) -> int:
    """Drop each file from the page cache (``posix_fadvise(DONTNEED)``); returns how many were evicted.

    Dirty pages (a file just written) cannot be dropped: one ``sync()`` flushes them all first. (One
    ``fdatasync`` per file cost 2.4 ms per file even when clean on the development VM's disk: 40 minutes
    of a profile at 10^6 files, benchmarks/scale_paths_files.py; ``sync()`` of a clean system, 13 ms.)
    """
    os.sync()
    count = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            count += 1
        finally:
            os.close(fd)
    return count


def _read_file(path: str) -> int:
    with open(path, "rb", buffering=0) as f:
        total = 0
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                return total
            total += len(chunk)


def warm_files(paths: Iterable[str], budget_bytes: int) -> tuple[int, int]:
    """Read files into the page cache until ``budget_bytes``; returns (files, bytes) read."""
    files = done = 0
    for path in paths:
        try:
            size = os.path.getsize(path)
        except OSError:
            continue
        if done + size > budget_bytes:
            break
        done += _read_file(path)
        files += 1
    return files, done


_libc = None


def _mincore_resident(path: str) -> tuple[int, int]:
    """(resident pages, total pages) of a file, through mmap + mincore."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        _libc.mmap.restype = ctypes.c_void_p
        _libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size = os.path.getsize(path)
    if size == 0:
        return 0, 0
    page = mmap.PAGESIZE
    pages = (size + page - 1) // page
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap failed for {path}")
        try:
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore failed for {path}")
            return sum(v & 1 for v in vec), pages
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def resident_fraction(paths: Iterable[str]) -> float:
    """Fraction of the files' pages that are in the page cache (1.0 for no pages)."""
    resident = total = 0
    for path in paths:
        try:
            r, t = _mincore_resident(path)
        except OSError:
            continue
        resident += r
        total += t
    return resident / total if total else 1.0


def measure_fetch_rate(
    files: list[str] | None = None,
    source: Any = None,
    threads: int = 1,
    max_items: int = 256,
    time_budget_s: float = 3.0,
    seed: int = 0,
) -> dict:
    """Cold raw-read rate of a random sample of items: ``bytes_per_s``, ``items_per_s`` and how.

    Reads ``files`` after evicting them from the page cache; without files, calls ``source.fetch(i)``
    (a coordl item source: whatever storage it fronts, possibly warm). Stops after ``max_items`` or
    ``time_budget_s``, whichever comes first.
    """
    rng = random.Random(seed)
    sample: list[Any]  # file paths, or item indices
    read_one: Callable[[Any], int]
    if files:
        sample = rng.sample(files, min(max_items, len(files)))
        evict_files(sample)
        read_one = _read_file
        method = "files, cold (posix_fadvise DONTNEED)"
    elif source is not None and callable(getattr(source, "fetch", None)):
        n = len(source)
        sample = rng.sample(range(n), min(max_items, n))
        fetch = source.fetch

        def fetch_len(i: int) -> int:
            return len(fetch(i))

        read_one = fetch_len
        method = "item source fetch()"
    else:
        raise ValueError("measure_fetch_rate needs dataset files or an item source with fetch()")
    if not sample:
        raise ValueError("measure_fetch_rate: the dataset has no items")
    # Each reader thread pulls the next item as soon as its read ends (no rounds: a device shared by
    # the loader's workers is never left idle between reads), until the sample or the budget is spent.
    deadline = time.perf_counter() + time_budget_s
    pending = iter(sample)
    lock = threading.Lock()
    totals = [0, 0]  # items, bytes

    def reader() -> None:
        while time.perf_counter() < deadline:
            with lock:
                item = next(pending, None)
            if item is None:
                return
            nbytes = read_one(item)
            with lock:
                totals[0] += 1
                totals[1] += nbytes

    t0, cpu0 = time.perf_counter(), time.process_time()
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        for f in [pool.submit(reader) for _ in range(max(1, threads))]:
            f.result()
    done_items, done_bytes = totals
    elapsed = max(time.perf_counter() - t0, 1e-9)
    cold_cpu = (time.process_time() - cpu0) / done_items if done_items else None
    return {
        "bytes_per_s": done_bytes / elapsed,
        "items_per_s": done_items / elapsed,
        "items": done_items,
        "bytes": done_bytes,
        "threads": max(1, threads),
        "method": method,
        "cold_read_cpu_s": cold_cpu,
        "warm_read_cpu_s": _warm_read_cpu_s(read_one, sample[:done_items]),
    }


def _warm_read_cpu_s(
    read_one: Callable[[Any], int], items: list[Any], most: int = 64, budget_s: float = 1.0
) -> float | None:
    """CPU seconds per item of reading ``items`` again, just after they were read (from the page cache, for
    files): what a read costs a job once its dataset is cached. A cold read costs its system calls and the
    page cache's fill too (on the 2-core Intel VM, 90 KB JPEGs: 0.08-0.13 ms of CPU cold, 0.03-0.045 warm)."""
    items = items[:most]
    if not items:
        return None
    deadline, done = time.perf_counter() + budget_s, 0
    cpu0 = time.process_time()
    for item in items:
        read_one(item)
        done += 1
        if time.perf_counter() > deadline:
            break
    return (time.process_time() - cpu0) / done

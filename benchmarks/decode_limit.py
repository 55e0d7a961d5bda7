"""The prep-bound references of ``bench_loader.py``: the machine's decode limit, and the same loops
with the storage reads the benchmark makes every loader do.

**The limit**: ``cores`` processes, each a tight ``transform(raw)`` loop over 200 images already in
memory, started at once, rates summed. No loader can beat it: it is the transform alone.

**The limit with a loader's working set** (``rows > 0``): the same loops, each over its own share of the
whole dataset (distinct items in memory, as a loader's cache holds them) and writing each output into the
next of ``rows`` rows of a buffer (as a loader's workers write into their batch slots) rather than into
one buffer that stays in the core's cache. A loader cannot avoid either; on the 2-core VM they cost
0.06-0.12 ms per sample in one process (5-10%).

**The bound with reads**: the same loops over the whole dataset, split between the processes, where
the items a loader's cache would hold (``cache_fraction`` of them, drawn by a seeded permutation)
are in memory and every other item is read from the benchmark's storage each time its turn comes,
the way coordl's loader reads its misses when the page cache has no room (``read_file(cached=False)``,
``O_DIRECT``). It is what a loader with no cost of its own (no processes beside the loops, no
Python per item, no hand-off of the reads) would reach in this benchmark: the gap between the limit
and it is the price of the storage reads the benchmark imposes, the gap between it and a loader is
the loader's own.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import random
import resource
import statistics
import time

import prep_recipes

LIMIT_ITEMS = 200  # distinct images each limit loop cycles over


def machine_cpu() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine so far, from /proc/stat: busy counts every
    process and kernel thread (the page-cache controller, the loop device's I/O), not only ours."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = v[:8]
    return (user + nice + system + irq + softirq) / hz, steal / hz


def _seeded_order(n: int) -> list[int]:
    order = list(range(n))
    random.Random(0).shuffle(order)
    return order


def cached_items(n: int, cache_fraction: float, order: list[int] | None = None) -> set[int]:
    """The items the bound holds in memory (the first ``cache_fraction`` of a seeded order); the rest it reads."""
    order = _seeded_order(n) if order is None else order
    return set(order[: int(n * cache_fraction)])


def _items(
    root: str, part: int, parts: int, reads: bool, cache_fraction: float, spread: bool = False
) -> list:
    """This process's items: bytes in memory (the first 200, or with ``spread`` its share of all of them), or
    (with ``reads``) the path of an item read each time."""
    from coordl.datasets.files import ImageFolder
    from coordl.fileread.read import read_file

    ds = ImageFolder(root)
    if spread:
        return [ds.fetch(i) for i in _seeded_order(len(ds))[part::parts]]
    if not reads:
        return [ds.fetch(i) for i in range(min(len(ds), LIMIT_ITEMS))]
    order = _seeded_order(len(ds))
    cached = cached_items(len(ds), cache_fraction, order)
    mine = order[part::parts]
    return [read_file(ds.samples[i][0], cached=False) if i in cached else ds.samples[i][0] for i in mine]


def _loop(
    root: str,
    count: int,
    queue,
    recipe: str,
    part: int,
    parts: int,
    reads: bool,
    fraction: float,
    rows: int = 0,
) -> None:
    import contextlib

    import torch

    from coordl.fileread.read import read_file
    from coordl.ring.output_buffers import lend

    torch.set_num_threads(1)
    items = _items(root, part, parts, reads, fraction, spread=rows > 0)
    tf = prep_recipes.make_transform(recipe)
    for item in items[:20]:  # warm up (first-touch memory is slow on this VM)
        out = tf(item if isinstance(item, bytes) else read_file(item, cached=False))
    lent: contextlib.AbstractContextManager = contextlib.nullcontext()
    if rows:  # each output into the next row, as a worker's batch slots (touched once first, as a ring's are)
        shape = out[0].shape if isinstance(out, (tuple, list)) else out.shape
        dtype = out[0].dtype if isinstance(out, (tuple, list)) else out.dtype
        buf, turn = torch.zeros((rows, *shape), dtype=dtype), itertools.count()
        lent = lend(
            lambda shape, dtype: buf[next(turn) % rows] if tuple(shape) == tuple(buf.shape[1:]) else None
        )
    t, cpu, machine = time.perf_counter(), time.process_time(), machine_cpu()
    minflt = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    with lent:
        for i in range(count):
            item = items[i % len(items)]
            tf(item if isinstance(item, bytes) else read_file(item, cached=False))
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - minflt) / count
    wall = time.perf_counter() - t
    busy, steal = (b - a for a, b in zip(machine, machine_cpu(), strict=True))
    queue.put((count / wall, (time.process_time() - cpu) / count, faults, busy / wall, steal / wall))


def decode_limit(
    root: str,
    cores: int,
    count: int,
    recipe: str,
    *,
    reads: bool = False,
    cache_fraction: float = 0.5,
    rows: int = 0,
) -> tuple[float, ...]:
    """(sum of the rates, mean CPU s/sample, mean minor faults/sample, machine cores busy, cores
    stolen by the hypervisor) of ``cores`` simultaneous tight loops; with ``reads``, the bound with
    the storage reads of a cache holding ``cache_fraction`` of the items; with ``rows``, the limit with a
    loader's working set (see the module's text)."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [
        ctx.Process(target=_loop, args=(root, count, q, recipe, part, cores, reads, cache_fraction, rows))
        for part in range(cores)
    ]
    for p in procs:
        p.start()
    results = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return (
        sum(r[0] for r in results),
        statistics.mean(r[1] for r in results),
        statistics.mean(r[2] for r in results),
        statistics.mean(r[3] for r in results),
        statistics.mean(r[4] for r in results),
    )

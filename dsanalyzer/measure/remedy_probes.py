"""Short probes for two remedies' what-ifs, run once in the prep-scaling run (a second or two in all).

* :func:`shared_batch`: coordinated prep (``coordinate=``) hands each job its batches through shared
  memory. One real batch is encoded the way the group's ring holds it (its bytes: the ring's slot size)
  and decoded back repeatedly: the CPU a job spends receiving a shared batch (``batchcodec.decode``
  copies it out of the slot), in place of the pipe's receive.
* :func:`split_prep`: the sample cache keeps the deterministic prefix of prep. A few items' prep is
  timed in its two parts (CPU time: ``prep_deterministic``, then ``prep_random`` on its array), and a
  small store of the kind the loader would use is filled with those arrays until it refuses: its
  capacity over the items it took is the bytes one cached sample costs (values, headers, index), and
  reading them back is a hit's cost.

Both take what they time as arguments (the codec, the store's constructor), so this module imports
neither coordl nor memcache; :mod:`dsanalyzer.jobs.coordl_loader` decides when they apply.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["shared_batch", "split_prep"]


def shared_batch(batch: Any, codec: Any, budget_s: float = 0.3, max_reps: int = 50) -> dict:
    """``batch_bytes`` (encoded) and ``receive_cpu_s_per_batch`` (decoding it out of a buffer)."""
    n = int(codec.encoded_size(batch))
    buf = bytearray(n)
    codec.encode_into(batch, memoryview(buf))
    codec.decode(memoryview(buf))  # warm: the first decode pays imports and allocator growth
    reps, t0, w0 = 0, time.thread_time(), time.perf_counter()
    while reps < max_reps and (reps < 3 or time.perf_counter() - w0 < budget_s):
        codec.decode(memoryview(buf))
        reps += 1
    return {"batch_bytes": n, "receive_cpu_s_per_batch": (time.thread_time() - t0) / reps, "reps": reps}


def _timed_parts(source: Any, raws: dict[int, bytes], budget_s: float) -> tuple[float, float, list, int]:
    """CPU seconds per sample of the deterministic prefix and of the random tail, the arrays, samples timed."""
    arrays = [source.prep_deterministic(raw, i) for i, raw in raws.items()]  # warm pass, untimed
    det = rand = 0.0
    n, w0 = 0, time.perf_counter()
    while n < 3 * len(raws) or (time.perf_counter() - w0 < budget_s and n < 20 * len(raws)):
        for i, raw in raws.items():
            t0 = time.thread_time()
            array = source.prep_deterministic(raw, i)
            t1 = time.thread_time()
            source.prep_random(array, i)
            det, rand, n = det + t1 - t0, rand + time.thread_time() - t1, n + 1
    return det / n, rand / n, arrays, n


def _store_costs(arrays: list, make_store: Callable[[int], Any]) -> dict:
    """Fill a store sized for ~64 of ``arrays`` until it refuses; its bytes per item and a read's CPU."""
    size = max(a.nbytes for a in arrays)
    capacity = int(min(256 << 20, max(8 << 20, 64 * size)))
    store = make_store(capacity)
    try:
        held, j = 0, 0
        while True:
            batch = {f"probe-{j + k}": arrays[(j + k) % len(arrays)] for k in range(32)}
            j += 32
            stored = int(store.put_many(batch))
            held += stored
            if stored < len(batch):
                break
        keys = [f"probe-{k}" for k in range(min(held, 32))]
        store.get_many(keys)  # warm
        reads, t0, w0 = 0, time.thread_time(), time.perf_counter()
        while reads < 3 * len(keys) or (time.perf_counter() - w0 < 0.2 and reads < 100 * len(keys)):
            store.get_many(keys)
            reads += len(keys)
        read_s = (time.thread_time() - t0) / reads
    finally:
        store.close()
    return {"cached_sample_bytes": capacity / max(1, held), "read_cpu_s_per_sample": read_s,
            "store_capacity_bytes": capacity, "store_items": held}  # fmt: skip


def split_prep(source: Any, make_store: Callable[[int], Any], items: int = 16, budget_s: float = 0.5) -> dict:
    """What a hit saves and costs: the prep's two parts per sample, a cached sample's bytes and read."""
    t0 = time.perf_counter()
    n = min(len(source), items)
    raws = {i: source.fetch(i) for i in range(n)}
    det, rand, arrays, timed = _timed_parts(source, raws, budget_s)
    out = {"det_cpu_s_per_sample": det, "random_cpu_s_per_sample": rand, "items_probed": n,
           "samples_timed": timed, "array_bytes": sum(a.nbytes for a in arrays) / len(arrays)}  # fmt: skip
    out.update(_store_costs(arrays, make_store))
    out["seconds"] = time.perf_counter() - t0
    return out

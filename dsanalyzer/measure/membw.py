"""Memory bandwidth, measured rather than assumed.

A cache hit costs ``item_bytes / memory_bandwidth``; the what-if model needs that figure for this
machine. We time NumPy copies between two buffers that were touched first (on a ballooned VM the
first touch of fresh memory is several times slower than the copy itself) and keep the best of N:
interference from other processes only ever makes a copy slower.
"""

from __future__ import annotations

import time

import numpy as np

__all__ = ["measure_memory_bandwidth"]


def measure_memory_bandwidth(size_bytes: int = 64 << 20, repeats: int = 7) -> float:
    """Bytes per second copied between two warm buffers of ``size_bytes``, best of ``repeats``."""
    if size_bytes <= 0 or repeats <= 0:
        raise ValueError(f"size_bytes and repeats must be positive, got {size_bytes}, {repeats}")
    src = np.ones(size_bytes, dtype=np.uint8)
    dst = np.zeros(size_bytes, dtype=np.uint8)
    np.copyto(dst, src)  # touch both before timing
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return size_bytes / best

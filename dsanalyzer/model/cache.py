"""Cache hit ratio as a function of cache size, for the two cache policies dsanalyzer models.

Both models describe the *steady state* (the second epoch on): each epoch visits every one of the N
items once, in a fresh uniformly random order, and the cache holds C items.

MinIO (coordl's cache): the first C items ever fetched are kept and never evicted, so every later
epoch hits on exactly those C items: ``h = C / N``.

OS page cache under random access, modelled as LRU. Item x was last read at a uniformly random
position of the previous epoch, leaving a fraction ``a`` of the items read after it; in this epoch it
is read after a fraction ``b`` of the items. Both are uniform on [0, 1] and independent. The
distinct items touched between its two reads are the union of two random subsets, whose size
concentrates at ``N * (1 - (1 - a)(1 - b))`` (the overlap is hypergeometric). LRU hits when that
reuse distance is below C, i.e. when ``(1 - a)(1 - b) > 1 - c`` with ``c = C / N``. For X, Y uniform,
``P(XY > t) = 1 - t + t ln t``, so::

    h_lru(c) = c + (1 - c) ln(1 - c)

At c = 0.5 that is 0.153: caching half the dataset gives 15% hits, the thrashing DS-Analyzer saw.
The closed form is exact as N grows; ``simulate_lru_hit_ratio`` checks it for finite N.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

__all__ = [
    "POLICIES",
    "minio_hit_ratio",
    "lru_hit_ratio",
    "hit_ratio",
    "cached_fraction_for_hit_ratio",
    "simulate_lru_hit_ratio",
    "simulate_minio_hit_ratio",
]

POLICIES = ("pagecache", "minio")


def _fraction(cache_items: float, dataset_items: float) -> float:
    if dataset_items <= 0:
        raise ValueError(f"dataset_items must be positive, got {dataset_items}")
    if cache_items < 0:
        raise ValueError(f"cache size must be >= 0, got {cache_items}")
    return min(1.0, cache_items / dataset_items)


def minio_hit_ratio(cache_items: float, dataset_items: float) -> float:
    """Steady-state hit ratio of a fill-once, never-evict cache: the cached fraction."""
    return _fraction(cache_items, dataset_items)


def lru_hit_ratio(cache_items: float, dataset_items: float) -> float:
    """Steady-state hit ratio of an LRU cache under a fresh random permutation every epoch."""
    c = _fraction(cache_items, dataset_items)
    if c >= 1.0:
        return 1.0
    if c <= 0.0:
        return 0.0
    return c + (1.0 - c) * math.log1p(-c)


def hit_ratio(policy: str, cache_items: float, dataset_items: float) -> float:
    """Hit ratio for ``policy`` ("pagecache" or "minio")."""
    if policy == "minio":
        return minio_hit_ratio(cache_items, dataset_items)
    if policy == "pagecache":
        return lru_hit_ratio(cache_items, dataset_items)
    raise ValueError(f"unknown cache policy {policy!r}: expected one of {', '.join(POLICIES)}")


def cached_fraction_for_hit_ratio(policy: str, target: float) -> float:
    """Smallest cached fraction C/N whose hit ratio reaches ``target`` (inverse of ``hit_ratio``)."""
    if not 0.0 <= target <= 1.0:
        raise ValueError(f"target hit ratio must be in [0, 1], got {target}")
    if policy == "minio" or target in (0.0, 1.0):
        hit_ratio(policy, 0, 1)  # validates the policy name
        return target
    lo, hi = 0.0, 1.0
    for _ in range(60):  # bisection: h_lru is increasing on [0, 1]
        mid = (lo + hi) / 2
        if hit_ratio(policy, mid, 1.0) >= target:
            hi = mid
        else:
            lo = mid
    return hi


def simulate_lru_hit_ratio(cache_items: int, dataset_items: int, epochs: int = 4, seed: int = 0) -> float:
    """Hit ratio of a real LRU over random permutations, skipping the cold first epoch."""
    rng = np.random.default_rng(seed)
    lru: OrderedDict[int, None] = OrderedDict()
    hits = accesses = 0
    for epoch in range(epochs):
        for item in rng.permutation(dataset_items).tolist():
            if item in lru:
                lru.move_to_end(item)
                hits += epoch > 0
            else:
                lru[item] = None
                if len(lru) > cache_items:
                    lru.popitem(last=False)
            accesses += epoch > 0
    return hits / max(1, accesses)


def simulate_minio_hit_ratio(cache_items: int, dataset_items: int, epochs: int = 3, seed: int = 0) -> float:
    """Hit ratio of a fill-once cache over random permutations, skipping the cold first epoch."""
    rng = np.random.default_rng(seed)
    cached: set[int] = set()
    hits = accesses = 0
    for epoch in range(epochs):
        for item in rng.permutation(dataset_items).tolist():
            if item in cached:
                hits += epoch > 0
            elif len(cached) < cache_items:
                cached.add(item)
            accesses += epoch > 0
    return hits / max(1, accesses)

"""Multi-hop neighbour sampling: uniform without replacement, deterministic by (seed, epoch, batch).

Hop ``h`` samples at most ``fanouts[h]`` distinct in-edges of every node reached so far (the seeds
for ``h = 0``; DGL's block structure: every node of a deeper block is also a destination of the next
hop, so a layer-``l`` model computes all nodes the layer above needs). A node with no more
neighbours than the fanout keeps all of them; ``fanout = -1`` means all.

Nodes get local ids in order of first appearance, seeds first, so the destinations of hop ``h`` are
the prefix ``input_nodes[:sizes[h]]`` and its sources lie in ``input_nodes[:sizes[h+1]]``.

Vectorised: nodes whose degree is at most ``_KEYS_MAX_DEGREE`` pick their edges by drawing a random
key per edge and keeping the ``fanout`` smallest of each segment (one sort over all of them); the
few hubs above it use ``Generator.choice`` (Floyd's method, O(fanout)) one by one, so a hub with a
million in-edges costs no more than a small node.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["SampledBlocks", "sample_blocks", "batch_rng"]

_KEYS_MAX_DEGREE = 256


def batch_rng(seed: int, epoch: int, batch_index: int) -> np.random.Generator:
    """The generator of one batch: the same for any number of workers and any worker order."""
    return np.random.default_rng([seed & 0xFFFFFFFF, 0x67_4C, epoch, batch_index])


@dataclass
class SampledBlocks:
    """The sampled subgraph of one batch, in local ids (positions in ``input_nodes``)."""

    input_nodes: np.ndarray  # int64 global ids, seeds first
    sizes: list[int]  # sizes[h]: destinations of hop h; sizes[h+1]: nodes after hop h
    local_edges: list[tuple[np.ndarray, np.ndarray]]  # per hop (src_local, dst_local), int64


def _pick_edges(
    indptr: np.ndarray, nodes: np.ndarray, fanout: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Edge positions (into ``indices``) chosen for each of ``nodes`` and the node's row in ``nodes``."""
    starts = indptr[nodes].astype(np.int64)
    deg = indptr[nodes + 1].astype(np.int64) - starts
    rows = np.arange(nodes.size, dtype=np.int64)
    take_all = deg <= fanout if fanout >= 0 else np.ones(nodes.size, dtype=bool)
    parts_pos, parts_row = (
        [_expand(starts[take_all], deg[take_all])],
        [np.repeat(rows[take_all], deg[take_all])],
    )
    keyed = ~take_all & (deg <= _KEYS_MAX_DEGREE)
    if keyed.any():
        k_rows, k_deg = rows[keyed], deg[keyed]
        pos = _expand(starts[keyed], k_deg)
        seg = np.repeat(np.arange(k_rows.size, dtype=np.int64), k_deg)
        order = np.lexsort((rng.random(pos.size), seg))  # by segment, then random key
        seg_start = np.repeat(np.cumsum(k_deg) - k_deg, k_deg)
        keep = order[(np.arange(order.size) - seg_start) < fanout]
        parts_pos.append(pos[keep])
        parts_row.append(k_rows[seg[keep]])
    for r in rows[~take_all & ~keyed]:  # hubs: O(fanout) each
        parts_pos.append(starts[r] + rng.choice(int(deg[r]), size=fanout, replace=False))
        parts_row.append(np.full(fanout, r, dtype=np.int64))
    return np.concatenate(parts_pos), np.concatenate(parts_row)


def _expand(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``concat(arange(s, s + c) for s, c)`` without a Python loop."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(starts - (np.cumsum(counts) - counts), counts)
    return offsets + np.arange(total, dtype=np.int64)


class _LocalIds:
    """Global -> local id map, one scratch array per process, reset after each batch (O(batch))."""

    def __init__(self, num_nodes: int) -> None:
        # int32: a batch never reaches 2**31 nodes, and the map is 4 bytes per graph node per worker.
        self.local_of = np.full(num_nodes, -1, dtype=np.int32)

    def build(self, seeds: np.ndarray) -> list[np.ndarray]:
        self.local_of[seeds] = np.arange(seeds.size, dtype=np.int32)
        return [seeds]

    def add(self, chunks: list[np.ndarray], count: int, candidates: np.ndarray) -> int:
        """Give new local ids to the not-yet-seen ``candidates`` in order of first appearance."""
        unseen = candidates[self.local_of[candidates] < 0]
        if unseen.size:
            uniq, first = np.unique(unseen, return_index=True)
            new = uniq[np.argsort(first, kind="stable")]
            self.local_of[new] = np.arange(count, count + new.size, dtype=np.int32)
            chunks.append(new)
            count += new.size
        return count

    def reset(self, nodes: np.ndarray) -> None:
        self.local_of[nodes] = -1


_scratch = threading.local()  # one map per thread: a pipeline thread and the caller never share one


def sample_blocks(
    indptr: np.ndarray,
    indices: np.ndarray,
    seeds: np.ndarray,
    fanouts: Sequence[int],
    rng: np.random.Generator,
) -> SampledBlocks:
    """Sample ``len(fanouts)`` hops of in-neighbours around ``seeds`` (distinct global ids)."""
    num_nodes = indptr.shape[0] - 1
    ids = getattr(_scratch, "ids", None)
    if ids is None or ids.local_of.size != num_nodes:  # one graph at a time: never keep several maps
        ids = _scratch.ids = _LocalIds(num_nodes)
    seeds = np.asarray(seeds, dtype=np.int64)
    chunks = ids.build(seeds)
    count, sizes, local_edges = seeds.size, [seeds.size], []
    try:
        for fanout in fanouts:
            dst_nodes = np.concatenate(chunks) if len(chunks) > 1 else chunks[0]
            pos, dst_local = _pick_edges(indptr, dst_nodes, int(fanout), rng)
            src_global = indices[pos].astype(np.int64)
            count = ids.add(chunks, count, src_global)
            local_edges.append((ids.local_of[src_global].astype(np.int64), dst_local))
            sizes.append(count)
        input_nodes = np.concatenate(chunks) if len(chunks) > 1 else chunks[0].copy()
    finally:
        for c in chunks:
            ids.reset(c)
    return SampledBlocks(input_nodes=input_nodes, sizes=sizes, local_edges=local_edges)

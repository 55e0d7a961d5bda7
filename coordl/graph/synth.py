"""Synthetic power-law graphs (R-MAT) with features and labels, so nothing needs a download.

R-MAT (Chakrabarti et al., 2004) drops each edge into one quadrant of the adjacency matrix, recursively,
with probabilities ``(a, b, c, d)``; the default ``(0.57, 0.19, 0.19, 0.05)`` (Graph500's) gives the
skewed degree distribution of real graphs (a few hubs, a long tail), which is what makes a
degree-ordered feature cache pay. Node ids are permuted afterwards, so a node's id says nothing about
its degree (a cache keyed on low ids would otherwise look good by accident).

Features are Gaussian; a node's label is the arg-max of a fixed random projection of its features
plus the mean of its neighbours' (so a GNN has something to learn from both). Features are written in
chunks straight to the memory-mapped file: a graph larger than memory can be made.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from coordl.graph.graph import Graph, _csr_by_dst

__all__ = ["rmat_edges", "synth_graph"]

_CHUNK_ROWS = 1 << 16


def rmat_edges(
    num_nodes: int,
    num_edges: int,
    rng: np.random.Generator,
    abcd: tuple[float, float, float, float] = (0.57, 0.19, 0.19, 0.05),
) -> tuple[np.ndarray, np.ndarray]:
    """``num_edges`` R-MAT edges (with repeats and self-loops) over ``num_nodes`` nodes, ids permuted."""
    a, b, c, _ = abcd
    scale = max(1, int(np.ceil(np.log2(max(2, num_nodes)))))
    src_parts, dst_parts, have = [], [], 0
    while have < num_edges:
        m = int((num_edges - have) * 1.1) + 16
        src = np.zeros(m, dtype=np.int64)
        dst = np.zeros(m, dtype=np.int64)
        for level in range(scale):
            r = rng.random(m)
            bit = np.int64(1) << (scale - 1 - level)
            src += bit * (r >= a + b)
            dst += bit * (((r >= a) & (r < a + b)) | (r >= a + b + c))
        ok = (src < num_nodes) & (dst < num_nodes)  # ids past num_nodes (not a power of two): redraw
        src_parts.append(src[ok])
        dst_parts.append(dst[ok])
        have += int(ok.sum())
    perm = rng.permutation(num_nodes)
    src = perm[np.concatenate(src_parts)[:num_edges]]
    dst = perm[np.concatenate(dst_parts)[:num_edges]]
    return src, dst


def _simple(
    src: np.ndarray, dst: np.ndarray, num_nodes: int, undirected: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Drop self-loops and repeated edges; add each edge's reverse when ``undirected``."""
    keep = src != dst
    src, dst = src[keep], dst[keep]
    if undirected:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    key = np.unique(src * num_nodes + dst)
    return key // num_nodes, key % num_nodes


def synth_graph(
    path: str | os.PathLike,
    num_nodes: int = 100_000,
    num_edges: int = 1_000_000,
    feature_dim: int = 128,
    num_classes: int = 16,
    train_fraction: float = 0.5,
    undirected: bool = True,
    seed: int = 0,
) -> Graph:
    """Write an R-MAT graph to ``path`` (a graph directory) and return it, loaded from there.

    Args:
        num_edges: edges drawn; the file has about that many after self-loops and repeats are dropped
            (``undirected``: half are drawn and each gets its reverse).
        feature_dim: float32 features per node; num_classes: labels are ``0 .. num_classes-1``.
        train_fraction: share of nodes in ``train_idx`` (a random subset, sorted).
    """
    for name, value, low in (
        ("num_nodes", num_nodes, 2),
        ("num_edges", num_edges, 1),
        ("feature_dim", feature_dim, 1),
        ("num_classes", num_classes, 2),
    ):
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")
    if not 0 < train_fraction <= 1:
        raise ValueError(f"train_fraction must be in (0, 1], got {train_fraction}")
    rng = np.random.default_rng(seed)
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    drawn = num_edges // 2 if undirected else num_edges
    src, dst = _simple(*rmat_edges(num_nodes, max(1, drawn), rng), num_nodes, undirected)
    indptr, indices = _csr_by_dst(src, dst, num_nodes)
    out_degree = np.bincount(src, minlength=num_nodes).astype(np.int64)
    del src, dst
    (root / "graph.json").unlink(missing_ok=True)  # a half-rewritten directory is never a graph
    features = np.memmap(root / "features.bin", dtype="<f4", mode="w+", shape=(num_nodes, feature_dim))
    proj = rng.standard_normal((feature_dim, num_classes)).astype(np.float32)
    own = np.empty((num_nodes, num_classes), dtype=np.float32)
    for lo in range(0, num_nodes, _CHUNK_ROWS):
        hi = min(num_nodes, lo + _CHUNK_ROWS)
        block = rng.standard_normal((hi - lo, feature_dim), dtype=np.float32)
        features[lo:hi] = block
        own[lo:hi] = block @ proj
    features.flush()
    labels = _labels(own, indptr, indices)
    train = np.sort(rng.permutation(num_nodes)[: max(1, int(num_nodes * train_fraction))])
    graph = Graph(indptr, indices, out_degree, features, labels, train_idx=train)
    graph.save(root)
    del features, graph
    return Graph.load(root)


def _labels(own: np.ndarray, indptr: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Arg-max of a node's own score plus its neighbours' mean score."""
    deg = np.diff(indptr)
    dst = np.repeat(np.arange(deg.size), deg)
    neigh = np.zeros_like(own)
    for k in range(own.shape[1]):  # one bincount per class: no [E, classes] temporary
        neigh[:, k] = np.bincount(dst, weights=own[indices, k], minlength=deg.size)
    neigh /= np.maximum(deg, 1)[:, None]
    return np.argmax(own + neigh, axis=1).astype(np.int64)

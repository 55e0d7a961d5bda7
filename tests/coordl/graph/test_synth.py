"""R-MAT synthesis: skewed degrees, ids that do not give the degree away, labels a model can learn."""

from __future__ import annotations

import numpy as np

from tests.coordl.graph.conftest import edge_set


def test_degrees_are_skewed(rmat):
    # A uniform random graph of this size puts ~2% of edge sources in its top 1% of nodes; R-MAT
    # with Graph500's parameters puts several times more (this seeded graph: 20%, measured once).
    out = np.sort(np.asarray(rmat.out_degree))[::-1]
    top_share = out[: rmat.num_nodes // 100].sum() / out.sum()
    assert top_share > 0.10


def test_ids_are_permuted(rmat):
    # Before the permutation the hubs are the lowest ids; after it they are spread over the id range.
    hubs = np.argsort(-np.asarray(rmat.out_degree))[:30]
    assert hubs.max() > rmat.num_nodes // 2


def test_undirected_without_self_loops_or_repeats(rmat):
    edges = edge_set(rmat)
    assert len(edges) == rmat.num_edges
    assert all((d, s) in edges for s, d in edges)
    assert not any(s == d for s, d in edges)


def test_labels_and_split(rmat):
    assert rmat.labels.min() >= 0 and rmat.labels.max() < 4
    assert np.all(np.diff(rmat.train_idx) > 0) and rmat.train_idx.size == rmat.num_nodes // 2

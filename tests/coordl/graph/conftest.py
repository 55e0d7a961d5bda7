"""Small graphs shared by the coordl.graph tests (deterministic by seed)."""

from __future__ import annotations

import numpy as np
import pytest

from coordl.graph.graph import Graph
from coordl.graph.synth import synth_graph


def edge_set(graph: Graph) -> set[tuple[int, int]]:
    """Every (src, dst) of the graph, from its CSR."""
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    return set(zip(np.asarray(graph.indices).tolist(), dst.tolist(), strict=True))


@pytest.fixture(scope="session")
def rmat_dir(tmp_path_factory: pytest.TempPathFactory):
    """A 3000-node R-MAT graph on disk: hubs with hundreds of neighbours and many small nodes."""
    path = tmp_path_factory.mktemp("rmat") / "g"
    synth_graph(path, num_nodes=3000, num_edges=40_000, feature_dim=8, num_classes=4, seed=1)
    return path


@pytest.fixture()
def rmat(rmat_dir) -> Graph:
    return Graph.load(rmat_dir)


@pytest.fixture()
def tiny() -> Graph:
    """7 nodes, hand-made: node 0 has in-edges from 1..5, node 6 none; features = node id."""
    src = [1, 2, 3, 4, 5, 0, 0, 2]
    dst = [0, 0, 0, 0, 0, 1, 2, 3]
    feats = np.arange(7, dtype=np.float32)[:, None] * np.ones((1, 3), dtype=np.float32)
    return Graph.from_edges(src, dst, feats, np.arange(7) % 2)

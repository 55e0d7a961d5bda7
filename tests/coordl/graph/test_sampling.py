"""The batch interface: edges of the graph, fanouts respected, seeds once per epoch, determinism."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from coordl.graph.loader import NeighborLoader
from coordl.graph.sampler import batch_rng, sample_blocks
from tests.coordl.graph.conftest import edge_set

FANOUTS = [5, 3]


def _loader(graph, **kw):
    args = dict(
        fanouts=FANOUTS, batch_size=64, shuffle=True, seed=7, feature_cache_bytes=4096, pipeline_depth=0
    )
    args.update(kw)
    return NeighborLoader(graph, graph.train_idx, **args)


def _fingerprint(batches) -> list:
    return [
        (b.seed_nodes.tolist(), b.input_nodes.tolist(), [(s.tolist(), d.tolist()) for s, d in b.edges])
        for b in batches
    ]


def test_batches_hold_the_interface(rmat):
    edges = edge_set(rmat)
    in_deg = rmat.in_degree()
    with _loader(rmat) as loader:
        for batch in loader:
            assert batch.input_nodes[: len(batch.seed_nodes)].tolist() == batch.seed_nodes.tolist()
            assert len(set(batch.input_nodes.tolist())) == len(batch.input_nodes)
            np.testing.assert_array_equal(batch.x.numpy(), rmat.features[batch.input_nodes.numpy()])
            np.testing.assert_array_equal(batch.y.numpy(), rmat.labels[batch.seed_nodes.numpy()])
            assert len(batch.edges) == len(FANOUTS)
            reached = set(batch.seed_nodes.tolist())
            for h, (src, dst) in enumerate(batch.edges):
                assert src.dtype == torch.int64 and dst.dtype == torch.int64
                pairs = list(zip(src.tolist(), dst.tolist(), strict=True))
                assert set(pairs) <= edges
                per_dst = Counter(dst.tolist())
                assert max(per_dst.values(), default=0) <= FANOUTS[h]
                assert set(per_dst) <= reached  # destinations of hop h: nodes reached before it
                for v in reached:  # min(degree, fanout) distinct edge slots per node
                    assert per_dst.get(v, 0) == min(int(in_deg[v]), FANOUTS[h])
                reached |= set(src.tolist())
            assert reached == set(batch.input_nodes.tolist())


def test_local_edges_index_input_nodes(rmat):
    with _loader(rmat) as loader:
        batch = next(iter(loader))
    for h, (src, dst) in enumerate(batch.edges):
        ei = batch.edge_index(h)
        assert torch.equal(batch.input_nodes[ei[0]], src) and torch.equal(batch.input_nodes[ei[1]], dst)
        assert int(ei[1].max()) < batch.sizes[h] and int(ei[0].max()) < batch.sizes[h + 1]
    assert batch.sizes[-1] == len(batch.input_nodes)


def test_each_seed_exactly_once_per_epoch(rmat):
    with _loader(rmat, drop_last=False) as loader:
        for _ in range(2):
            seen = torch.cat([b.seed_nodes for b in loader]).tolist()
            assert sorted(seen) == sorted(rmat.train_idx.tolist())


def test_shuffle_changes_order_between_epochs(rmat):
    with _loader(rmat) as loader:
        first = [b.seed_nodes.tolist() for b in loader]
        second = [b.seed_nodes.tolist() for b in loader]
    assert first != second


def test_deterministic_by_seed(rmat):
    with _loader(rmat) as a, _loader(rmat) as b, _loader(rmat, seed=8) as c:
        fa, fb, fc = _fingerprint(a), _fingerprint(b), _fingerprint(c)
    assert fa == fb
    assert fa != fc


@pytest.mark.parametrize(
    "mode", [dict(num_workers=0, pipeline_depth=3), dict(num_workers=2, pipeline_depth=4)]
)
def test_same_batches_for_any_worker_count(rmat, mode):
    with _loader(rmat) as serial, _loader(rmat, **mode) as other:
        for _ in range(2):  # epoch 0 and 1
            assert _fingerprint(serial) == _fingerprint(other)


def test_small_hand_graph_without_replacement(tiny):
    rng = batch_rng(0, 0, 0)
    blocks = sample_blocks(tiny.indptr, tiny.indices, np.array([0, 6]), [3], rng)
    src, dst = blocks.local_edges[0]
    chosen = blocks.input_nodes[src[dst == 0]]
    assert len(chosen) == 3 and len(set(chosen.tolist())) == 3 and set(chosen.tolist()) <= {1, 2, 3, 4, 5}
    assert (dst == 1).sum() == 0  # node 6 has no in-edges
    all_blocks = sample_blocks(tiny.indptr, tiny.indices, np.array([0]), [-1], rng)
    assert sorted(all_blocks.input_nodes[1:].tolist()) == [1, 2, 3, 4, 5]


def test_uniform_over_neighbours(tiny):
    # Node 0 has 5 neighbours; fanout 2 picks each with p = 2/5. Over 5000 draws the count of each
    # is Binomial(5000, 0.4): sd = 34.6, so +-200 (5.8 sd) fails by chance with p < 1e-8.
    counts = Counter()
    for b in range(5000):
        blocks = sample_blocks(tiny.indptr, tiny.indices, np.array([0]), [2], batch_rng(3, 0, b))
        counts.update(blocks.input_nodes[1:].tolist())
    assert set(counts) == {1, 2, 3, 4, 5}
    assert all(abs(c - 2000) < 200 for c in counts.values())


def test_hub_sampling_is_uniform_and_distinct():
    # A hub above the keyed-sort threshold takes the per-node path (Generator.choice).
    from coordl.graph.graph import Graph

    n = 2001
    g = Graph.from_edges(np.arange(1, n), np.zeros(n - 1, dtype=np.int64), np.zeros((n, 1), np.float32), None)
    blocks = sample_blocks(g.indptr, g.indices, np.array([0]), [10], batch_rng(0, 0, 0))
    picked = blocks.input_nodes[1:]
    assert len(picked) == 10 and len(set(picked.tolist())) == 10 and picked.min() >= 1


def test_bad_arguments_are_named(rmat):
    with pytest.raises(ValueError, match="repeated"):
        NeighborLoader(rmat, [1, 1], [2])
    with pytest.raises(ValueError, match="fanouts"):
        NeighborLoader(rmat, [1], [0])
    with pytest.raises(ValueError, match="batch_size"):
        NeighborLoader(rmat, [1], [2], batch_size=0)
    with pytest.raises(ValueError, match="pipeline_depth=0"):
        NeighborLoader(rmat, [1], [2], num_workers=2, pipeline_depth=0)
    with pytest.raises(ValueError, match="outside"):
        NeighborLoader(rmat, [rmat.num_nodes], [2])


def test_bool_mask_seeds(rmat):
    mask = np.zeros(rmat.num_nodes, dtype=bool)
    mask[[5, 9]] = True
    with NeighborLoader(rmat, torch.from_numpy(mask), [2], batch_size=8, pipeline_depth=0) as loader:
        assert sorted(next(iter(loader)).seed_nodes.tolist()) == [5, 9]

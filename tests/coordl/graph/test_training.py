"""Batches train a model: plain-torch GraphSAGE (and PyG's SAGEConv when installed)."""

from __future__ import annotations

import pytest
import torch

from coordl.graph.loader import NeighborLoader
from coordl.graph.models import GraphSAGE, mean_aggregate


def test_mean_aggregate_by_hand():
    x = torch.tensor([[1.0], [3.0], [5.0]])
    ei = torch.tensor([[1, 2, 0], [0, 0, 1]])
    assert mean_aggregate(x, ei, 2).flatten().tolist() == [4.0, 1.0]


def test_graphsage_loss_drops(rmat):
    torch.manual_seed(0)
    model = GraphSAGE(rmat.features.shape[1], 32, int(rmat.labels.max()) + 1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    with NeighborLoader(
        rmat,
        rmat.train_idx,
        [5, 5],
        batch_size=128,
        shuffle=True,
        num_workers=0,
        pipeline_depth=2,
        feature_cache_bytes=1 << 14,
        seed=0,
    ) as loader:
        for _ in range(3):
            epoch = []
            for batch in loader:
                loss = torch.nn.functional.cross_entropy(model(batch), batch.y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                epoch.append(loss.item())
            losses.append(sum(epoch) / len(epoch))
    # Deterministic (fixed seeds, one thread of sampling); labels are a function of features, so a
    # working model more than halves the loss of its first epoch by the third.
    assert losses[2] < 0.5 * losses[0]


def test_pyg_sageconv_consumes_a_batch(rmat):
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    conv1, conv2 = pyg_nn.SAGEConv(8, 16), pyg_nn.SAGEConv(16, 4)
    with NeighborLoader(rmat, rmat.train_idx, [4, 4], batch_size=32, pipeline_depth=0, seed=0) as loader:
        batch = next(iter(loader))
    (ei1, n_src1, n_dst1), (ei0, _, n_dst0) = batch.blocks()
    x = batch.x[:n_src1]
    h = conv1((x, x[:n_dst1]), ei1).relu()
    out = conv2((h, h[:n_dst0]), ei0)
    assert out.shape == (len(batch.seed_nodes), 4)

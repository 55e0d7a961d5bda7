"""A plain-torch GraphSAGE over :class:`~coordl.graph.Batch` blocks (no PyG needed).

Mean aggregation (Hamilton et al., 2017): ``h_dst = W_self h_dst + W_neigh mean(h_src over sampled
in-edges)``. Layer ``l`` runs on block ``l`` of :meth:`Batch.blocks` (outermost hop first), so each
layer computes exactly the rows the next one needs and the last one gives the seeds' logits.
"""

from __future__ import annotations

import torch
from torch import nn

from coordl.graph.batch import Batch

__all__ = ["SAGEConv", "GraphSAGE", "mean_aggregate"]


def mean_aggregate(x_src: torch.Tensor, edge_index: torch.Tensor, num_dst: int) -> torch.Tensor:
    """Mean of ``x_src[src]`` over each destination's sampled in-edges (zeros where none)."""
    src, dst = edge_index[0], edge_index[1]
    out = torch.zeros((num_dst, x_src.shape[1]), dtype=x_src.dtype, device=x_src.device)
    out.index_add_(0, dst, x_src[src])
    count = torch.bincount(dst, minlength=num_dst).clamp_(min=1).to(x_src.dtype)
    return out / count.unsqueeze(1)


class SAGEConv(nn.Module):
    """One GraphSAGE layer on a bipartite block (sources -> the first ``num_dst`` of them)."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.self_lin = nn.Linear(in_dim, out_dim)
        self.neigh_lin = nn.Linear(in_dim, out_dim, bias=False)

    def forward(self, x_src: torch.Tensor, edge_index: torch.Tensor, num_dst: int) -> torch.Tensor:
        return self.self_lin(x_src[:num_dst]) + self.neigh_lin(mean_aggregate(x_src, edge_index, num_dst))


class GraphSAGE(nn.Module):
    """``num_layers`` SAGE layers with ReLU (and dropout) between them; one per sampled hop."""

    def __init__(
        self, in_dim: int, hidden_dim: int, out_dim: int, num_layers: int = 2, dropout: float = 0.0
    ) -> None:
        super().__init__()
        dims = [in_dim] + [hidden_dim] * (num_layers - 1) + [out_dim]
        self.layers = nn.ModuleList(SAGEConv(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.dropout = dropout

    def forward(self, batch: Batch) -> torch.Tensor:
        blocks = batch.blocks()
        if len(blocks) != len(self.layers):
            raise ValueError(f"the batch has {len(blocks)} hops, the model {len(self.layers)} layers")
        h = batch.x.float()[: blocks[0][1]]
        for i, (layer, (edge_index, _num_src, num_dst)) in enumerate(zip(self.layers, blocks, strict=True)):
            h = layer(h, edge_index, num_dst)
            if i < len(self.layers) - 1:
                h = torch.nn.functional.dropout(torch.relu(h), self.dropout, self.training)
        return h

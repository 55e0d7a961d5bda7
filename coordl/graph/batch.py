"""One mini-batch of sampled subgraph: seeds, input nodes, features, labels and per-hop edges.

Global ids are what the interface promises (``edges[h]`` is a ``(src, dst)`` pair of global-id
LongTensors, every one an edge of the graph); a model needs local ids (rows of ``x``), which
:meth:`Batch.edge_index` gives per hop without another lookup, since the sampler numbers nodes as it
meets them: seeds first, then each hop's new nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Batch"]


@dataclass
class Batch:
    """A sampled mini-batch.

    Attributes:
        seed_nodes: the batch's training nodes (global ids).
        input_nodes: every node whose features the model needs (global ids), ``seed_nodes`` first.
        x: features of ``input_nodes``, same order; y: labels of ``seed_nodes`` (None without labels).
        edges: per hop ``h``, ``(src, dst)`` global ids of the sampled edges (``h = 0``: into the seeds).
        sizes: ``sizes[h]`` destinations of hop ``h`` (``input_nodes[:sizes[h]]``); ``sizes[h+1]``
            nodes reached after hop ``h``.
        local_edges: ``edges`` as positions in ``input_nodes``.
        batch_index, epoch: where the batch sits in the loader's order.
    """

    seed_nodes: torch.Tensor
    input_nodes: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor | None
    edges: list[tuple[torch.Tensor, torch.Tensor]]
    sizes: list[int]
    local_edges: list[tuple[torch.Tensor, torch.Tensor]]
    batch_index: int = 0
    epoch: int = 0

    @property
    def num_hops(self) -> int:
        return len(self.edges)

    def edge_index(self, hop: int) -> torch.Tensor:
        """``[2, E]`` local (src, dst) of hop ``hop``: src indexes ``x[:sizes[hop+1]]``, dst
        indexes the ``sizes[hop]`` destinations. The PyG bipartite convention for ``(x_src, x_dst)``."""
        src, dst = self.local_edges[hop]
        return torch.stack([src, dst])

    def blocks(self) -> list[tuple[torch.Tensor, int, int]]:
        """Per model layer, outermost hop first: ``(edge_index, num_src, num_dst)``.

        A ``len(fanouts)``-layer model applies layer ``l`` to block ``l``; its output rows are the
        next layer's input rows, and the last layer's are the seeds.
        """
        hops = range(self.num_hops - 1, -1, -1)
        return [(self.edge_index(h), self.sizes[h + 1], self.sizes[h]) for h in hops]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """A copy with every tensor on ``device``."""

        def mv(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=non_blocking)

        return Batch(
            seed_nodes=mv(self.seed_nodes),
            input_nodes=mv(self.input_nodes),
            x=mv(self.x),
            y=None if self.y is None else mv(self.y),
            edges=[(mv(s), mv(d)) for s, d in self.edges],
            sizes=list(self.sizes),
            local_edges=[(mv(s), mv(d)) for s, d in self.local_edges],
            batch_index=self.batch_index,
            epoch=self.epoch,
        )

    def __len__(self) -> int:
        """Number of seeds (what a throughput counts as samples)."""
        return int(self.seed_nodes.shape[0])

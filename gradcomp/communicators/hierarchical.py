"""Hierarchical top-k (HiTopKComm, MLSys'21): dense inside a node, sparse across nodes.

Reduce-scatter inside the node, compress each rank's shard, all-gather the sparse shards across nodes among the
ranks with the same local rank, scatter-add, then all-gather the node's summed shards inside the node.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from gradcomp.collectives import all_gather_flat, allgather_payloads, node_groups, reduce_scatter_flat
from gradcomp.communicators.base import Communicator, completed
from gradcomp.compressors import Compressor, Sparsifier
from gradcomp.memory import Memory

__all__ = ["HierarchicalTopK"]


class HierarchicalTopK(Communicator):
    """Sum over all ranks, with the sparsifier applied to each node's shards.

    Args:
        intra, inter: ``collectives.node_groups(local_size)``: my node's ranks, and my local rank's peers on
            the other nodes. ``group`` is not used: the two groups together span the world.

    Always compresses under ``plan="auto"`` (``plannable`` is False).
    """

    plannable = False

    def __init__(
        self,
        compressor: Compressor,
        memory: Memory,
        intra: dist.ProcessGroup,
        inter: dist.ProcessGroup,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        if not isinstance(compressor, Sparsifier):
            raise TypeError(f"hierarchical top-k needs a sparsifier, got {compressor!r}")
        super().__init__(compressor, memory, group)
        self.intra, self.inter = intra, inter

    @classmethod
    def from_options(
        cls,
        compressor: Compressor,
        memory: Memory,
        group: dist.ProcessGroup | None,
        options: Mapping[str, Any],
    ) -> HierarchicalTopK:
        """``local_size`` (ranks per node) defaults to ``$LOCAL_WORLD_SIZE`` (torchrun sets it), else one node."""
        local = int(options.get("local_size", os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size())))
        intra, inter = node_groups(local)
        return cls(compressor, memory, intra, inter, group)

    def sync(
        self, x: torch.Tensor, key: object, partitions: int = 1, shapes: list[torch.Size] | None = None
    ) -> torch.futures.Future:
        local = dist.get_world_size(self.intra)
        n = x.numel()
        padded = torch.nn.functional.pad(x, (0, (-n) % local))
        shard = torch.empty(padded.numel() // local, dtype=x.dtype, device=x.device)
        reduce_scatter_flat(shard, padded, group=self.intra)
        payload, ctx = self.compress(shard, key)
        node_sum = self.compressor.aggregate(allgather_payloads(payload, group=self.inter), ctx)
        full = torch.empty_like(padded)
        all_gather_flat(full, node_sum, group=self.intra)
        return completed(full[:n])

"""PTO: partition the optimizer step across workers, then share the updated parameters.

After the gradient all-reduce every rank holds the same averaged gradients, so running the full optimizer on every
rank repeats the same work P times. Here each rank steps only the parameters it owns (balanced by size) and then
each owner broadcasts its updated parameters as one flat buffer (an all-gather in effect). Optimizer state is
kept only by the owner, which also divides optimizer memory by P (as ZeRO stage 1 does).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist

__all__ = ["PartitionedOptimizer", "partition_by_size"]


def partition_by_size(numels: list[int], world: int) -> list[int]:
    """Owner rank of each tensor: largest first onto the least-loaded rank (deterministic on every rank)."""
    load = [0] * world
    owner = [0] * len(numels)
    for i in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += numels[i]
    return owner


class PartitionedOptimizer:
    """Wraps an optimizer class so each rank steps only its share of ``params``.

    Args:
        params: the model's parameters (same order on every rank).
        optimizer_class: e.g. ``torch.optim.SGD``; built with ``**defaults`` over this rank's share.
        group: process group (default: the world).
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        optimizer_class: type[torch.optim.Optimizer],
        group: dist.ProcessGroup | None = None,
        **defaults: object,
    ) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.owner = partition_by_size([p.numel() for p in self.params], self.world)
        mine = [p for p, o in zip(self.params, self.owner, strict=True) if o == self.rank]
        self.optimizer = optimizer_class(mine, **defaults) if mine else None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """Step this rank's share, then broadcast every share from its owner."""
        if self.optimizer is not None:
            self.optimizer.step()
        for r in range(self.world):
            owned = [p for p, o in zip(self.params, self.owner, strict=True) if o == r]
            if not owned:
                continue
            flat = torch.cat([p.reshape(-1) for p in owned])
            src = r if self.group is None else dist.get_global_rank(self.group, r)
            dist.broadcast(flat, src=src, group=self.group)
            if r != self.rank:
                offset = 0
                for p in owned:
                    p.copy_(flat[offset : offset + p.numel()].view_as(p))
                    offset += p.numel()

"""All-gather communicator: every rank's payload travels to every rank, which decodes and sums them."""

from __future__ import annotations

import torch

from gradcomp import futures
from gradcomp.collectives import allgather_payloads
from gradcomp.communicators.base import Communicator

__all__ = ["AllGather"]


class AllGather(Communicator):
    """One all-gather per part of the bucket; ``partitions`` > 1 pipelines them (SeCoPa): part i+1 is
    compressed while part i is on the wire. Works with any compressor."""

    def sync(
        self, x: torch.Tensor, key: object, partitions: int = 1, shapes: list[torch.Size] | None = None
    ) -> torch.futures.Future:
        parts = torch.tensor_split(x, partitions) if partitions > 1 else (x,)
        pending, ctxs = [], []
        for i, part in enumerate(parts):
            payload, ctx = self.compress(part, (key, i))
            ctxs.append(ctx)
            pending.append(allgather_payloads(payload, self.group, async_op=True))

        def finish(_: object) -> torch.Tensor:
            outs = [self.compressor.aggregate(f.value(), c) for f, c in zip(pending, ctxs, strict=True)]
            return outs[0] if len(outs) == 1 else torch.cat(outs)

        return futures.then(futures.collect_all(pending), finish)

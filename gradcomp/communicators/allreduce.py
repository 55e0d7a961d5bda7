"""All-reduce communicators: the dense one (no compression) and the compressed one for summable payloads."""

from __future__ import annotations

import torch
import torch.distributed as dist

from gradcomp import futures
from gradcomp.communicators.base import Communicator
from gradcomp.compressors import Compressor, NoCompression
from gradcomp.memory import Memory, NoMemory

__all__ = ["DenseAllReduce", "AllReduce"]


class DenseAllReduce(Communicator):
    """The float32 bucket, all-reduced as DDP would: what every bucket the plan keeps dense goes through.

    It returns the collective's own Future, so communication overlaps the rest of the backward pass.
    """

    compresses = False
    plannable = False

    def __init__(
        self,
        compressor: Compressor | None = None,
        memory: Memory | None = None,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__(compressor or NoCompression(), memory or NoMemory(), group)

    def sync(
        self, x: torch.Tensor, key: object, partitions: int = 1, shapes: list[torch.Size] | None = None
    ) -> torch.futures.Future:
        # The collective's own future (its value is a one-element list; the hook unwraps it).
        return dist.all_reduce(x, group=self.group, async_op=True).get_future()


class AllReduce(Communicator):
    """Sum ``payload[0]`` of every rank with one all-reduce, then decode with this rank's other payload tensors.

    Needs a ``summable`` compressor (16-bit casts, random-k with indices shared by a common seed).
    """

    def __init__(
        self, compressor: Compressor, memory: Memory, group: dist.ProcessGroup | None = None
    ) -> None:
        if not compressor.summable:
            raise TypeError(f"{compressor!r} payloads cannot be summed by an all-reduce; use AllGather")
        super().__init__(compressor, memory, group)

    def sync(
        self, x: torch.Tensor, key: object, partitions: int = 1, shapes: list[torch.Size] | None = None
    ) -> torch.futures.Future:
        payload, ctx = self.compress(x, key)
        summed = payload[0].clone()
        fut = dist.all_reduce(summed, group=self.group, async_op=True).get_future()
        return futures.then(
            fut, lambda f: self.compressor.decompress([f.value()[0]] + payload[1:], ctx), keep=(summed,)
        )

"""Low-rank communicator: PowerSGD's two all-reduces (``gradcomp.powersgd``) behind the communicator interface."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from gradcomp.communicators.base import Communicator, completed
from gradcomp.compressors import Compressor
from gradcomp.memory import Memory
from gradcomp.powersgd import PowerSGDReducer

__all__ = ["LowRankAllReduce"]


class LowRankAllReduce(Communicator):
    """Each matrix-shaped parameter travels as rank-r factors P and Q; the rest dense in P's all-reduce.

    The low-rank step needs the bucket's parameter shapes (``needs_shapes``) and state across steps (Q, warm-up
    counters), so it is a communicator rather than an element-wise compressor; ``compressor`` is the element-wise
    part, no compression. PowerSGD keeps small tensors dense by its own rule (``min_compression_rate``), so
    ``plan="auto"`` fits no cost model for it (``plannable`` is False). The memory is the reducer's error feedback.
    """

    plannable = False
    needs_shapes = True

    def __init__(
        self,
        compressor: Compressor,
        memory: Memory,
        group: dist.ProcessGroup | None = None,
        rank: int = 1,
        start_iter: int = 10,
        min_compression_rate: float = 2.0,
    ) -> None:
        self.reducer = PowerSGDReducer(
            rank=rank, start_iter=start_iter, min_compression_rate=min_compression_rate, memory=memory
        )
        super().__init__(compressor, memory, group)

    @classmethod
    def from_options(
        cls,
        compressor: Compressor,
        memory: Memory,
        group: dist.ProcessGroup | None,
        options: Mapping[str, Any],
    ) -> LowRankAllReduce:
        """``powersgd_rank`` (r, default 1), ``start_iter`` (dense warm-up steps, 10), ``min_compression_rate``."""
        return cls(
            compressor,
            memory,
            group,
            rank=int(options.get("powersgd_rank", 1)),
            start_iter=int(options.get("start_iter", 10)),
            min_compression_rate=float(options.get("min_compression_rate", 2.0)),
        )

    @property
    def memory(self) -> Memory:
        return self.reducer.memory

    @memory.setter
    def memory(self, value: Memory) -> None:
        self.reducer.memory = value

    def sync(
        self, x: torch.Tensor, key: object, partitions: int = 1, shapes: list[torch.Size] | None = None
    ) -> torch.futures.Future:
        return completed(self.reducer.reduce(x, shapes or [x.shape], key, self.group))

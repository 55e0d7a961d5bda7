"""The communicator interface (GRACE's communicator role): how one flat bucket travels and is summed over ranks.

A communicator owns a compressor and a memory and runs the whole step for one bucket: compensate the gradient
(memory), compress it, record what was actually sent (memory), move the payloads, decode and sum. The DDP hook
(``gradcomp.hooks``) only chooses between the method's communicator and the dense one, as the plan decides.

Three class attributes tell the hook and the planner what a communicator does, so neither looks at method names:

- ``compresses``: False for the dense all-reduce (the planner never has anything to decide for it);
- ``plannable``: ``plan="auto"`` may fit a cost model and keep buckets dense where compression does not pay;
  False where the method applies its own rule (PowerSGD) or is meant to compress every bucket (hierarchical);
- ``needs_shapes``: the bucket's parameter shapes must be passed to ``sync`` (low-rank methods).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from gradcomp.compressors import Compressor, Context
from gradcomp.memory import Memory

__all__ = ["Communicator", "completed"]


def completed(t: torch.Tensor) -> torch.futures.Future:
    """A Future that already holds ``t`` (for communicators that finish their rounds inside ``sync``)."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(t)
    return fut


class Communicator(ABC):
    """Sum over the ranks of ``group`` of one flat tensor per call, through ``compressor`` and ``memory``."""

    compresses: bool = True
    plannable: bool = True
    needs_shapes: bool = False

    def __init__(
        self, compressor: Compressor, memory: Memory, group: dist.ProcessGroup | None = None
    ) -> None:
        self.compressor = compressor
        self.memory = memory
        self.group = group
        self.world = dist.get_world_size(group)

    @classmethod
    def from_options(
        cls,
        compressor: Compressor,
        memory: Memory,
        group: dist.ProcessGroup | None,
        options: Mapping[str, Any],
    ) -> Communicator:
        """Build from ``gradcomp.register``'s arguments; each communicator reads only the options it has."""
        return cls(compressor, memory, group)

    @abstractmethod
    def sync(
        self, x: torch.Tensor, key: object, partitions: int = 1, shapes: list[torch.Size] | None = None
    ) -> torch.futures.Future:
        """Sum over ranks of flat ``x`` (already divided by the world size).

        The Future holds the sum, or a one-element list with it (a collective's own Future; the hook unwraps it).
        ``key`` names the bucket (memory and seeds are per key); ``partitions`` > 1 asks for pipelined parts
        where the communicator supports it; ``shapes`` are the bucket's parameter shapes (``needs_shapes``).
        """

    def compress(self, x: torch.Tensor, key: object) -> tuple[list[torch.Tensor], Context]:
        """Compensate, compress and update the memory with what this payload sends."""
        comp = self.memory.compensate(x, key)
        payload, ctx = self.compressor.compress(comp, key)
        if self.memory.enabled:
            self.memory.update(comp, key, self.compressor.decompress(payload, ctx))
        return payload, ctx

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.compressor!r}, {type(self.memory).__name__}())"

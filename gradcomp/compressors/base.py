"""The compressor interface shared by every method (GRACE's compressor role).

A compressor turns a flat gradient into a list of payload tensors plus a context that only holds what every rank
can rebuild on its own (numel, dtype, device), so a peer's payload can be decoded with the local context. How
payloads travel is the communicator's business (``gradcomp.communicators``); a compressor only says whether its
payloads may be summed on the wire (``summable``):

- ``summable = True``: ``payload[0]`` of all ranks can be summed element-wise (fp16, random-k with a shared seed);
  any further payload tensors are metadata every rank computes identically (random-k's indices) and stay local;
- otherwise each rank's payload has to be decoded on its own and the decoded tensors summed (``aggregate``).

Payload shapes depend only on the input's numel, never on its values, so all-gathers are fixed-size.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Compressor", "Context"]


@dataclass(frozen=True)
class Context:
    """What decoding needs and every rank knows: the flat input's size, dtype and device."""

    numel: int
    dtype: torch.dtype
    device: torch.device


class Compressor(ABC):
    """Compress / decompress / aggregate one flat tensor; stateless apart from per-key counters."""

    name: str = "base"
    #: True when E[decompress(compress(x))] != x: such methods need error feedback to converge.
    biased: bool = False
    #: True when ``payload[0]`` of every rank can be summed by an all-reduce (see the module docstring).
    summable: bool = False

    @classmethod
    def from_options(cls, ratio: float, options: Mapping[str, Any]) -> Compressor:
        """Build from ``gradcomp.register``'s arguments; each method reads only the options it has."""
        return cls()

    @abstractmethod
    def compress(self, x: torch.Tensor, key: object = None) -> tuple[list[torch.Tensor], Context]:
        """Encode flat ``x``; ``key`` names the tensor (methods with per-tensor state or seeds use it)."""

    @abstractmethod
    def decompress(self, payload: list[torch.Tensor], ctx: Context) -> torch.Tensor:
        """Decode one payload to a dense flat tensor of ``ctx.numel`` elements."""

    def aggregate(self, payloads: list[list[torch.Tensor]], ctx: Context) -> torch.Tensor:
        """Sum of the decoded payloads of all ranks (sparse methods override this with one scatter-add)."""
        out = self.decompress(payloads[0], ctx).clone()
        for p in payloads[1:]:
            out += self.decompress(p, ctx)
        return out

    def payload_bytes(self, numel: int) -> int:
        """Bytes one rank sends for a tensor of ``numel`` float32 elements (for the planner's cost model)."""
        payload, _ = self.compress(torch.zeros(numel), key=("__size_probe__", numel))
        return sum(t.numel() * t.element_size() for t in payload)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

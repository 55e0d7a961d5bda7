"""Error feedback (GRACE's memory role): what a biased compressor dropped is added back to the next gradient.

Invariant (checked by the tests): over any number of steps, the sum of what was sent plus the current residual
equals the sum of the gradients that went in.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

__all__ = ["Memory", "NoMemory", "ResidualMemory"]


class Memory(ABC):
    """Compensate a gradient before compression, then update from what was actually sent.

    Keys name a tensor (a DDP bucket index, or a part of one) so each keeps its own state.
    """

    #: False when ``update`` does nothing: communicators then skip decoding their own payload for it.
    enabled: bool = True

    @abstractmethod
    def compensate(self, x: torch.Tensor, key: object) -> torch.Tensor:
        """The tensor to compress in place of ``x`` (``x`` plus what earlier steps of ``key`` dropped)."""

    @abstractmethod
    def update(self, compensated: torch.Tensor, key: object, sent: torch.Tensor) -> None:
        """Record what was dropped: ``compensated`` is what ``compensate`` returned, ``sent`` its decoded form."""

    def residual(self, key: object) -> torch.Tensor | None:
        """The current residual of ``key`` (``None`` when there is none)."""
        return None

    def state_dict(self) -> dict[object, torch.Tensor]:
        """Every key's residual (for checkpoints and inspection)."""
        return {}


class NoMemory(Memory):
    """Error feedback off: nothing is remembered."""

    enabled = False

    def compensate(self, x: torch.Tensor, key: object) -> torch.Tensor:
        return x

    def update(self, compensated: torch.Tensor, key: object, sent: torch.Tensor) -> None:
        pass


class ResidualMemory(Memory):
    """Per-key residual ``e``: ``compensate(g) = g + e``; ``update`` sets ``e = compensated - sent``."""

    def __init__(self) -> None:
        self.residuals: dict[object, torch.Tensor] = {}

    def compensate(self, x: torch.Tensor, key: object) -> torch.Tensor:
        r = self.residuals.get(key)
        if r is None or r.shape != x.shape or r.device != x.device:
            # A new tensor, or DDP rebuilt its buckets after the first step: start from no residual.
            return x.clone()
        return x + r

    def update(self, compensated: torch.Tensor, key: object, sent: torch.Tensor) -> None:
        self.residuals[key] = compensated - sent

    def residual(self, key: object) -> torch.Tensor | None:
        return self.residuals.get(key)

    def state_dict(self) -> dict[object, torch.Tensor]:
        return dict(self.residuals)

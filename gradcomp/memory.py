"""Error feedback (residual memory): what a biased compressor dropped is added back to the next gradient.

Invariant (checked by the tests): over any number of steps, the sum of what was sent plus the current residual
equals the sum of the gradients that went in.
"""

from __future__ import annotations

import torch

__all__ = ["ResidualMemory", "NoMemory"]


class NoMemory:
    """Error feedback off: nothing is remembered."""

    def compensate(self, x: torch.Tensor, key: object) -> torch.Tensor:
        return x

    def update(self, compensated: torch.Tensor, key: object, sent: torch.Tensor) -> None:
        pass

    def residual(self, key: object) -> torch.Tensor | None:
        return None

    def add(self, key: object, dropped: torch.Tensor) -> None:
        pass

    def state_dict(self) -> dict[object, torch.Tensor]:
        return {}


class ResidualMemory:
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
        """The current residual of ``key`` (``None`` before its first update)."""
        return self.residuals.get(key)

    def add(self, key: object, dropped: torch.Tensor) -> None:
        """Give back values a later stage dropped (gTop-k: local picks that lost globally)."""
        self.residuals[key] = self.residuals[key] + dropped

    def state_dict(self) -> dict[object, torch.Tensor]:
        return dict(self.residuals)

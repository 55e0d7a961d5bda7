"""Models for the reference trainer: a small CNN (compute-bound, small gradients) and a VGG-like net whose
large fully connected layers make gradient traffic dominate (where compression can pay)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SmallCNN", "VGGLike", "build_model", "parse_model_name"]


class SmallCNN(nn.Module):
    """Two conv blocks and a linear head: about 60 K parameters at 32x32 input."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
        )  # fmt: skip
        self.head = nn.Linear(64 * 16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class VGGLike(nn.Module):
    """Small conv stem plus VGG's big classifier shape: ``hidden`` x ``hidden`` FC layers dominate the size.

    At ``hidden=2048`` it has about 12.6 M parameters (50 MB of float32 gradient per step).
    """

    def __init__(self, classes: int = 10, hidden: int = 2048) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
        )  # fmt: skip
        self.classifier = nn.Sequential(
            nn.Linear(128 * 16, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, classes),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


def parse_model_name(name: str) -> tuple[str, int | None]:
    """``("small", None)`` or ``("vgg", hidden)`` for ``small``, ``vgg`` and ``vgg:<hidden>``; else ValueError."""
    if name == "small":
        return "small", None
    if name == "vgg":
        return "vgg", 2048
    if name.startswith("vgg:"):
        hidden = name.split(":", 1)[1]
        if hidden.isdigit() and int(hidden) > 0:
            return "vgg", int(hidden)
    raise ValueError(f"unknown model {name!r}; choose small, vgg or vgg:<hidden> (hidden a positive integer)")


def build_model(name: str, classes: int) -> nn.Module:
    """``small`` or ``vgg`` (also ``vgg:<hidden>``)."""
    kind, hidden = parse_model_name(name)
    if kind == "small":
        return SmallCNN(classes)
    return VGGLike(classes, hidden or 2048)

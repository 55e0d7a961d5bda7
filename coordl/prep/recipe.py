"""The parameters of the standard ImageNet pipelines, in one place for the CPU and DALI paths.

``coordl.transforms.train_transform`` / ``eval_transform`` (CPU) and ``coordl.dali.train_pipeline`` /
``eval_pipeline`` read these, so "the same pipeline" on either path crops, flips and normalizes alike.
The values are torchvision's (``RandomResizedCrop``'s defaults, the 0.875 centre-crop fraction of
the ResNet evaluation recipe, the ImageNet channel statistics).
"""

from __future__ import annotations

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "CROP_SCALE",
    "CROP_RATIO",
    "FLIP_PROBABILITY",
    "CENTER_CROP_FRACTION",
    "shorter_side_for",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# RandomResizedCrop: the crop's area as a fraction of the image's, and its aspect ratio (w / h).
CROP_SCALE = (0.08, 1.0)
CROP_RATIO = (3 / 4, 4 / 3)
FLIP_PROBABILITY = 0.5
# Evaluation resizes the shorter side to size / 0.875 (256 for 224), then centre-crops ``size``; the
# resize-first training recipe resizes to the same shorter side before its random crop.
CENTER_CROP_FRACTION = 0.875


def shorter_side_for(size: int) -> int:
    """The shorter side the evaluation (and resize-first training) recipe resizes to: 256 for 224."""
    return round(size / CENTER_CROP_FRACTION)

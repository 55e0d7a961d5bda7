"""The DALI graph a ``DALILoader`` runs on each batch of raw bytes: decode, augment, normalize.

``coordl.dali.train_pipeline(size)`` and ``coordl.dali.eval_pipeline(size)`` describe the prep; the
loader calls them inside its DALI pipeline definition with the encoded-bytes node and the device:

* ``device="cpu"``: the decoder runs on the host (libjpeg-turbo through nvImageCodec), and so does
  every operator after it; batches come out as CPU tensors.
* ``device="gpu"``: the decoder runs with ``device="mixed"`` (host parses the headers, nvJPEG or the
  hardware JPEG decoder decodes on the GPU) and the augmentations run on the GPU; batches come out as
  CUDA tensors, so no CPU core touches a pixel.

Training uses DALI's fused ``decoders.image_random_crop`` (it decodes only the random crop's region
where the codec allows, which is what DALI's own ResNet-50 example does) followed by a resize to the
output size: together they are ``fn.random_resized_crop`` applied to the decoded image, with the same
scale and aspect-ratio ranges as torchvision's ``RandomResizedCrop``. ``fused=False`` decodes the
whole image and then runs ``fn.random_resized_crop``. Both end in ``fn.crop_mirror_normalize``
(random horizontal flip, ImageNet mean/std, float CHW).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from coordl.prep import recipe

__all__ = ["DALITransform", "train_pipeline", "eval_pipeline", "IMAGENET_MEAN", "IMAGENET_STD"]

# One definition of the standard pipelines' parameters for the CPU transforms and DALI.
IMAGENET_MEAN = recipe.IMAGENET_MEAN
IMAGENET_STD = recipe.IMAGENET_STD

# nvJPEG's scratch buffers, preallocated so the first epochs do not reallocate while the step runs
# (the values DALI's ResNet-50 example uses for ImageNet-sized JPEGs).
_DEVICE_MEMORY_PADDING = 211_025_920
_HOST_MEMORY_PADDING = 140_544_512


@dataclass(frozen=True)
class DALITransform:
    """What a ``DALILoader`` does to each item's bytes, expressed as DALI operators.

    Args:
        size: output height and width (square).
        train: random crop + random flip (True) or resize + center crop (False).
        scale, ratio: the random-resized-crop area fraction and aspect-ratio ranges.
        resize: eval only: the shorter side before the center crop (default ``size / 0.875``).
        mean, std: per channel, in [0, 1] units (scaled by 255 for DALI's uint8 input).
        flip: train only: random horizontal flip with probability 0.5.

    The defaults are :mod:`coordl.prep.recipe`'s, the same as ``coordl.transforms.train_transform`` /
    ``eval_transform`` use on the CPU (DALI resizes without antialiasing, the CPU path with it).
        fused: train only: decode just the crop window (``decoders.image_random_crop``) instead of the
            whole image followed by ``fn.random_resized_crop``. Same distribution, less decode work.
    """

    size: int
    train: bool = True
    scale: tuple[float, float] = recipe.CROP_SCALE
    ratio: tuple[float, float] = recipe.CROP_RATIO
    resize: int | None = None
    mean: Sequence[float] = field(default=IMAGENET_MEAN)
    std: Sequence[float] = field(default=IMAGENET_STD)
    flip: bool = True
    fused: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size <= 0:
            raise ValueError(f"DALITransform: size must be a positive int, got {self.size!r}")
        if len(self.mean) != 3 or len(self.std) != 3 or any(s <= 0 for s in self.std):
            raise ValueError("DALITransform: mean and std need 3 values each, std > 0")
        if not (0 < self.scale[0] <= self.scale[1] <= 1):
            raise ValueError(f"DALITransform: scale must satisfy 0 < lo <= hi <= 1, got {self.scale!r}")
        if not (0 < self.ratio[0] <= self.ratio[1]):
            raise ValueError(f"DALITransform: ratio must satisfy 0 < lo <= hi, got {self.ratio!r}")

    def __call__(self, jpegs: Any, device: str) -> Any:
        """The output node for the encoded-bytes node ``jpegs``; call inside a DALI pipeline definition.

        Args:
            jpegs: the batch of encoded images (a DALI DataNode of uint8 1-D samples).
            device: "cpu" (decode and augment on the host) or "gpu" (nvJPEG, augment on the GPU).
        """
        from nvidia.dali import fn, types

        if device not in ("cpu", "gpu"):
            raise ValueError(f"DALITransform: device must be 'cpu' or 'gpu', got {device!r}")
        decoder_device = "mixed" if device == "gpu" else "cpu"
        extra: dict[str, Any] = {}
        if device == "gpu":
            extra = {
                "device_memory_padding": _DEVICE_MEMORY_PADDING,
                "host_memory_padding": _HOST_MEMORY_PADDING,
            }
        mirror: Any = 0
        if self.train:
            if self.fused:
                images = fn.decoders.image_random_crop(
                    jpegs, device=decoder_device, output_type=types.RGB,
                    random_area=list(self.scale), random_aspect_ratio=list(self.ratio), **extra,
                )  # fmt: skip
                images = fn.resize(images, size=[self.size, self.size], antialias=False)
            else:
                images = fn.decoders.image(jpegs, device=decoder_device, output_type=types.RGB, **extra)
                images = fn.random_resized_crop(
                    images, size=[self.size, self.size], random_area=list(self.scale),
                    random_aspect_ratio=list(self.ratio), antialias=False,
                )  # fmt: skip
            if self.flip:
                mirror = fn.random.coin_flip(probability=recipe.FLIP_PROBABILITY)
            crop: dict[str, Any] = {}
        else:
            images = fn.decoders.image(jpegs, device=decoder_device, output_type=types.RGB, **extra)
            shorter = self.resize if self.resize is not None else recipe.shorter_side_for(self.size)
            images = fn.resize(images, resize_shorter=shorter, antialias=False)
            crop = {"crop": (self.size, self.size)}
        return fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,
            output_layout="CHW",
            mean=[m * 255 for m in self.mean],
            std=[s * 255 for s in self.std],
            mirror=mirror,
            **crop,
        )


def train_pipeline(size: int = 224, **options: Any) -> DALITransform:
    """Training prep: decode, random-resized-crop to ``size``, random flip, normalize (float CHW).

    ``options`` are :class:`DALITransform`'s (``scale``, ``ratio``, ``mean``, ``std``, ``flip``, ``fused``).
    """
    return DALITransform(size, train=True, **options)


def eval_pipeline(size: int = 224, **options: Any) -> DALITransform:
    """Evaluation prep: decode, resize the shorter side to ``size / 0.875``, center crop, normalize."""
    return DALITransform(size, train=False, **options)

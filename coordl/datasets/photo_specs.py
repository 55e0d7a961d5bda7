"""What each file of a photographic dataset is: size, quality, chroma, odd format, drawn with ImageNet's statistics.

:mod:`coordl.datasets.photos` cuts real photographs into crops; this module decides, for image ``i`` of ``n``,
from ``(seed, i)`` alone (and ``(seed, n)`` for where the rare odd files go), which photograph, which box
of it, the output width and height, the JPEG quality and chroma subsampling, and whether the file is an
ordinary baseline JPEG, a grayscale or progressive one, a CMYK JPEG or a PNG named ``.JPEG``.

Sources of each distribution (ImageNet-1k train, ILSVRC2012: 1,281,167 files). Where no published
figure was found the number is an estimate, and says so:

- **Width and height.** Most files have their longer side at 500 pixels (Flickr's "medium" size, from
  which most of ImageNet was downloaded; the most common size is "around 500 by 500": M. Ehrlich,
  *Compression in the ImageNet Dataset*, 2021). The share at exactly 500 (70%) and the log-normal spread
  of the rest (median 375, sigma 0.6, 48 to 2560 pixels; ImageNet's extremes are 500x33 and 3888x2592)
  are estimates that reproduce the usually quoted mean of about 400-470 x 350-390 pixels. Aspect
  ratios: 4:3 and 3:2 most, some square, some wider (estimate); a quarter portrait (estimate).
- **JPEG quality.** "The vast majority ... were quantized at quality 96", with a tail down to below 10
  (Ehrlich 2021). Shares here (estimates): 75% at 96, 17% at 75-95, 6% at 50-74, 2% at 10-49.
- **Chroma subsampling.** Most files are not subsampled (4:4:4), some 4:2:0, a few 4:2:2 (and a few 4:1:1,
  which Pillow does not write) (Ehrlich 2021). Shares here (estimates): 80% / 17% / 3%.
- **Grayscale** (one-channel JPEG): 2% (estimate; ImageNet has "a few percent"). **Progressive**: 1% (estimate).
- **CMYK JPEGs**: 22 of 1,281,167 (the list in github.com/cytsai/ilsvrc-cmyk-image-list, which TensorFlow's
  ImageNet preparation script skips); **PNG named .JPEG**: 1 (``n02105855_2933.JPEG``, same sources).
  At these rates a dataset of a few thousand files would hold none, so any dataset of at least
  :data:`MIN_N_FOR_ODD` files holds at least one of each (over-represented there, on purpose: the loaders
  must meet them).
- **File size** is not drawn: it follows from the pixels, the size, the quality and the chroma layout.
  A grain of 0-8 levels (Gaussian, on luma; sigma uniform per image) stands in for a consumer camera's
  sensor noise: the wallpapers are cleaner and more out of focus than Flickr snapshots, and without it
  files come out about 20% smaller. ImageNet's mean is ~115 KB (the 147.9 GB training archive over
  1.28M files), from under 10 KB to over 10 MB. Here the mean is ~85 KB and the median ~75 KB: lighter
  than ImageNet's (smoother content), so entropy-decode cost per file is if anything underestimated;
  the largest files are smaller too (the sources are at most 2560 pixels wide).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["ImageSpec", "draw_spec", "odd_positions", "MIN_N_FOR_ODD", "IMAGENET_TRAIN_FILES"]

IMAGENET_TRAIN_FILES = 1_281_167
CMYK_PER_IMAGENET = 22
PNG_PER_IMAGENET = 1
MIN_N_FOR_ODD = 20  # below this, no forced CMYK/PNG file (a tiny test dataset stays all-JPEG)

P_LONG_SIDE_500 = 0.70
LONG_SIDE_MEDIAN, LONG_SIDE_SIGMA, LONG_SIDE_MIN, LONG_SIDE_MAX = 375.0, 0.6, 48, 2560
ASPECTS = (4 / 3, 3 / 2, 1.0, 16 / 9)  # long / short; the rest: uniform in [1, 2.5]
P_ASPECTS = (0.45, 0.25, 0.08, 0.05)
P_PORTRAIT = 0.25
QUALITY_BANDS = ((96, 96), (75, 95), (50, 74), (10, 49))
P_QUALITY = (0.75, 0.17, 0.06, 0.02)
SUBSAMPLINGS = ("4:4:4", "4:2:0", "4:2:2")
P_SUBSAMPLING = (0.80, 0.17, 0.03)
P_GRAY, P_PROGRESSIVE = 0.02, 0.01
GRAIN_MAX = 8.0
_TAG = 0x9407  # keeps these draws apart from coordl synth's for the same seed


@dataclass(frozen=True)
class ImageSpec:
    """Everything that makes file ``index``: a pure function of ``(seed, index)`` (and ``n`` for ``kind``).

    ``box`` is (left, top, right, bottom) in the source photograph's pixels; ``kind`` is one of
    ``"rgb"``, ``"gray"``, ``"progressive"``, ``"cmyk"``, ``"png"``.
    """

    index: int
    source: int
    box: tuple[float, float, float, float]
    width: int
    height: int
    quality: int
    subsampling: str
    kind: str
    grain: float
    flip: bool


def odd_positions(n: int, seed: int) -> dict[int, str]:
    """Which indices are the CMYK JPEGs and the PNG named .JPEG: ImageNet's rates, at least one each."""
    if n < MIN_N_FOR_ODD:
        return {}
    cmyk = max(1, round(n * CMYK_PER_IMAGENET / IMAGENET_TRAIN_FILES))
    png = max(1, round(n * PNG_PER_IMAGENET / IMAGENET_TRAIN_FILES))
    picks = np.random.default_rng([seed, n, _TAG, 1]).choice(n, size=cmyk + png, replace=False)
    return {int(i): ("cmyk" if k < cmyk else "png") for k, i in enumerate(picks)}


def _output_size(rng: np.random.Generator) -> tuple[int, int]:
    if rng.random() < P_LONG_SIDE_500:
        long_side = 500
    else:
        draw = LONG_SIDE_MEDIAN * math.exp(rng.normal(0.0, LONG_SIDE_SIGMA))
        long_side = int(min(max(round(draw), LONG_SIDE_MIN), LONG_SIDE_MAX))
    k = int(rng.choice(len(P_ASPECTS) + 1, p=[*P_ASPECTS, 1 - sum(P_ASPECTS)]))
    aspect = ASPECTS[k] if k < len(ASPECTS) else float(rng.uniform(1.0, 2.5))
    short_side = max(8, round(long_side / aspect))
    if rng.random() < P_PORTRAIT:
        return short_side, long_side
    return long_side, short_side


def _box(
    rng: np.random.Generator, src_size: tuple[int, int], out: tuple[int, int]
) -> tuple[float, float, float, float]:
    """A box of the source with the output's aspect, log-uniform in scale between 1:1 and the whole frame."""
    src_w, src_h = src_size
    out_w, out_h = out
    z_max = min(src_w / out_w, src_h / out_h)  # source pixels per output pixel, the largest box
    z = z_max if z_max <= 1.0 else math.exp(rng.uniform(0.0, math.log(z_max)))
    box_w, box_h = out_w * z, out_h * z
    left = float(rng.uniform(0.0, src_w - box_w))
    top = float(rng.uniform(0.0, src_h - box_h))
    return left, top, left + box_w, top + box_h


def draw_spec(index: int, seed: int, source_sizes: list[tuple[int, int]], odd: dict[int, str]) -> ImageSpec:
    """The spec of file ``index``: its photograph, box, size, quality, chroma, format and grain."""
    rng = np.random.default_rng([seed, index, _TAG])
    source = int(rng.integers(len(source_sizes)))
    width, height = _output_size(rng)
    box = _box(rng, source_sizes[source], (width, height))
    band = QUALITY_BANDS[int(rng.choice(len(P_QUALITY), p=P_QUALITY))]
    quality = int(rng.integers(band[0], band[1] + 1))
    subsampling = SUBSAMPLINGS[int(rng.choice(len(SUBSAMPLINGS), p=P_SUBSAMPLING))]
    u = rng.random()
    kind = "gray" if u < P_GRAY else "progressive" if u < P_GRAY + P_PROGRESSIVE else "rgb"
    grain = float(rng.uniform(0.0, GRAIN_MAX))
    flip = bool(rng.random() < 0.5)
    return ImageSpec(
        index, source, box, width, height, quality, subsampling, odd.get(index, kind), grain, flip
    )

"""CPU image prep: fast JPEG decode and the standard augmentations, as small composable stages.

Why this module is long: the stages, their fusion plan and the two recipes belong together (each fused
stage must stay exactly its stages' composition), and splitting them would scatter one contract.

Every stage is a callable with a ``__repr__`` that names all its parameters (the repr of the
deterministic prefix is the cache key's ``prep_identity``: change a parameter and cached arrays are
no longer reused) and two class attributes:

- ``deterministic``: the stage's output depends only on its input (no randomness);
- ``array_output``: the stage returns a compact HWC ``uint8`` NumPy array, worth caching.

``Compose.split()`` cuts a pipeline into the longest prefix of deterministic array stages (decode,
resize: cacheable by ``prep_deterministic``) and the rest (random crop, flip, to-tensor: run after
the cache on every epoch). Random augmentations must never be cached, or every epoch would see the
same crop.

Randomness comes from torch's global RNG (``torch.rand``), or from ``generator=`` when given.
``torch.utils.data.DataLoader`` and ``coordl.DataLoader`` seed torch's RNG in each worker with
``base_seed + worker_id``, so ``torch.manual_seed(s)`` in the main process makes every epoch's
augmentations reproducible. NumPy's global RNG is deliberately not used: torch does not seed it per
worker, so forked workers would produce identical crops.

Decoding uses simplejpeg (libjpeg-turbo) for JPEG, about 2.5x Pillow's speed per core here; Pillow
decodes everything else (PNG, BMP, WebP, CMYK JPEGs). When a ``Compose`` runs ``Decode()`` directly
followed by ``RandomResizedCrop``, it draws the crop from the JPEG header's size and decodes only that
box (:mod:`coordl.prep.cropdecode`): the same crop box from the same random draws, the same pixels
where the box is under twice the output size, a DCT-domain downscale above that. Undecodable bytes raise
:class:`coordl.errors.CorruptItemError`; the dataset adds the file path. Resizing uses torch's antialiased
bilinear uint8 kernel (what torchvision's ``antialias=True`` uses).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from coordl.prep import cropdecode
from coordl.prep import recipe as recipes
from coordl.prep.decode import decode_image
from coordl.ring.output_buffers import new_output

__all__ = [
    "Compose",
    "Decode",
    "DecodeJPEG",
    "ResizeShorter",
    "CenterCrop",
    "RandomResizedCrop",
    "RandomHorizontalFlip",
    "ToTensor",
    "Normalize",
    "train_transform",
    "eval_transform",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
]

IMAGENET_MEAN = recipes.IMAGENET_MEAN
IMAGENET_STD = recipes.IMAGENET_STD
TRAIN_RECIPES = ("standard", "resize_first")


class Stage:
    """Base of all stages: a callable with a full-parameter repr."""

    deterministic: bool = True
    array_output: bool = True

    def __call__(self, x: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _params(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._params().items())
        return f"{type(self).__name__}({args})"


class Compose(Stage):
    """Apply ``stages`` in order. ``split()`` separates the cacheable prefix from the random rest.

    ``crop_decode=False`` keeps ``Decode()`` + ``RandomResizedCrop`` as two stages (decode the whole
    image, then crop) instead of decoding only the crop's box; the crop boxes are the same either way.
    """

    def __init__(self, stages: Iterable[Callable[[Any], Any]], crop_decode: bool = True) -> None:
        self.stages = list(stages)
        self.crop_decode = crop_decode
        self.deterministic = all(getattr(s, "deterministic", False) for s in self.stages)
        self.array_output = bool(self.stages) and getattr(self.stages[-1], "array_output", False)
        self._plan: list[Callable[[Any], Any]] = []
        self._plan_key: tuple[int, ...] = ()

    def __call__(self, x: Any) -> Any:
        key = tuple(map(id, self.stages))  # ``stages`` is a public list: re-plan if it was edited
        if key != self._plan_key:
            self._plan, self._plan_key = _fuse(self.stages, self.crop_decode), key
        for stage in self._plan:
            x = stage(x)
        return x

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_plan", "_plan_key")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"crop_decode": True, **state}, _plan=[], _plan_key=())  # pickles from before it

    def __len__(self) -> int:
        return len(self.stages)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.stages)

    @property
    def reads_buffers(self) -> bool:
        """Whether a read-only view may stand for the bytes: the first stage says it reads buffers
        (``Decode``; the fused crop decoder reads through the same calls)."""
        return bool(self.stages) and getattr(self.stages[0], "reads_buffers", False) is True

    def split(self) -> tuple[Compose, Compose]:
        """(deterministic prefix whose output is a uint8 array, everything after it)."""
        cut = 0
        for stage in self.stages:
            if not (getattr(stage, "deterministic", False) and getattr(stage, "array_output", False)):
                break
            cut += 1
        return Compose(self.stages[:cut], self.crop_decode), Compose(self.stages[cut:], self.crop_decode)

    def split_tail(self) -> tuple[Compose, Compose]:
        """(everything before the tail, the tail): the longest suffix of deterministic stages whose
        output is not a compact array (``ToTensor``, ``Normalize``). The head's output is the compact
        uint8 array a remote worker sends back (4x fewer bytes than the float tensor); the tail turns it
        into the sample where it is used (:mod:`coordl.remote.compact`)."""
        cut = len(self.stages)
        while cut > 0:
            stage = self.stages[cut - 1]
            if not getattr(stage, "deterministic", False) or getattr(stage, "array_output", True):
                break
            cut -= 1
        return Compose(self.stages[:cut], self.crop_decode), Compose(self.stages[cut:], self.crop_decode)

    def __repr__(self) -> str:
        return "Compose([" + ", ".join(repr(s) for s in self.stages) + "])"


class Decode(Stage):
    """Bytes -> HWC uint8 RGB array (simplejpeg for JPEG, Pillow otherwise).

    ``min_size``: the shorter side a later resize needs; allows a faster DCT-domain downscale when
    the image is at least twice that size (the output then differs slightly from a full decode).
    """

    # Reads any bytes-like object (a view of a cache row too) and keeps no reference to it.
    reads_buffers = True

    def __init__(self, min_size: int | None = None, fastdct: bool = False) -> None:
        self.min_size = min_size
        self.fastdct = fastdct

    def _params(self) -> dict[str, Any]:
        return {"min_size": self.min_size, "fastdct": self.fastdct}

    def __call__(self, raw: bytes) -> np.ndarray:
        return decode_image(raw, self.min_size, self.fastdct)


DecodeJPEG = Decode


def _resize(arr: np.ndarray, width: int, height: int, compact: bool = True) -> np.ndarray:
    """Antialiased bilinear resize of an HWC uint8 array; returns an HWC array.

    torch's uint8 kernel (channels-last, antialias=True) measured ~3x faster than Pillow's
    BILINEAR here (1900 vs 650 resizes/s of 500x375 -> 341x256 on one core), same filter family.
    The input goes in as a channels-last NCHW tensor whose batch stride is the image's size: with the
    stride torch gives a ``[None]`` of the HWC array (3), torch cannot tell its memory format and
    writes a planar output through an extra copy (0.16 vs 0.11 ms for a 300x300 box to 224x224 here).
    The output is then HWC-contiguous; ``compact=True`` guarantees that (what a cache stores),
    ``compact=False`` accepts any layout torch returns (for a stage whose output is consumed at once).
    """
    src = torch.from_numpy(arr)
    if not src.is_contiguous():  # a crop's view: one copy, as channels-last interpolation needs
        src = src.contiguous()
    h, w, c = src.shape
    t = src.as_strided((1, c, h, w), (h * w * c, 1, w * c, c))
    out = torch.nn.functional.interpolate(
        t, size=(height, width), mode="bilinear", antialias=True, align_corners=False
    )
    if compact:
        out = out.contiguous(memory_format=torch.channels_last)
    return out[0].permute(1, 2, 0).numpy()


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    h, w = size
    return int(h), int(w)


class ResizeShorter(Stage):
    """Resize so that the shorter side is ``size`` pixels, keeping the aspect ratio."""

    def __init__(self, size: int) -> None:
        if size <= 0:
            raise ValueError(f"ResizeShorter: size must be positive, got {size}")
        self.size = int(size)

    def _params(self) -> dict[str, Any]:
        return {"size": self.size}

    def __call__(self, arr: np.ndarray) -> np.ndarray:
        h, w = arr.shape[:2]
        short, long = (h, w) if h <= w else (w, h)
        if short == self.size:
            return arr
        new_long = int(self.size * long / short)
        new_w, new_h = (new_long, self.size) if h <= w else (self.size, new_long)
        return _resize(arr, new_w, new_h)


class CenterCrop(Stage):
    """Crop the central ``size`` (int or (h, w)); pads with zeros where the image is smaller."""

    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = _pair(size)

    def _params(self) -> dict[str, Any]:
        return {"size": self.size}

    def __call__(self, arr: np.ndarray) -> np.ndarray:
        th, tw = self.size
        h, w = arr.shape[:2]
        if h < th or w < tw:
            pad_h, pad_w = max(th - h, 0), max(tw - w, 0)
            pads = ((pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2), (0, 0))
            arr = np.pad(arr, pads[: arr.ndim])
            h, w = arr.shape[:2]
        top, left = (h - th) // 2, (w - tw) // 2
        return arr[top : top + th, left : left + tw]


def _uniform(generator: torch.Generator | None, n: int) -> list[float]:
    return torch.rand(n, generator=generator).tolist()


class RandomResizedCrop(Stage):
    """Crop a random area fraction ``scale`` with aspect ratio in ``ratio``, resized to ``size``.

    The same sampling rule as torchvision (10 tries, then a centre crop clamped to ``ratio``).
    """

    deterministic = False

    def __init__(
        self,
        size: int | Sequence[int],
        scale: tuple[float, float] = recipes.CROP_SCALE,
        ratio: tuple[float, float] = recipes.CROP_RATIO,
        generator: torch.Generator | None = None,
    ) -> None:
        self.size = _pair(size)
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.generator = generator

    def _params(self) -> dict[str, Any]:
        return {"size": self.size, "scale": self.scale, "ratio": self.ratio}

    def get_params(self, height: int, width: int) -> tuple[int, int, int, int]:
        """(top, left, crop_height, crop_width) for an image of this size."""
        area = height * width
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        for _ in range(10):
            u_area, u_ratio, u_top, u_left = _uniform(self.generator, 4)
            target = area * (self.scale[0] + u_area * (self.scale[1] - self.scale[0]))
            aspect = math.exp(log_lo + u_ratio * (log_hi - log_lo))
            w = int(round(math.sqrt(target * aspect)))
            h = int(round(math.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                top = min(int(u_top * (height - h + 1)), height - h)
                left = min(int(u_left * (width - w + 1)), width - w)
                return top, left, h, w
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            w, h = width, int(round(width / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            h, w = height, int(round(height * self.ratio[1]))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, arr: np.ndarray) -> np.ndarray:
        top, left, h, w = self.get_params(*arr.shape[:2])
        th, tw = self.size
        # The crop is a view: the resize reads it in place, no intermediate copy.
        return _resize(arr[top : top + h, left : left + w], tw, th, compact=False)


class RandomHorizontalFlip(Stage):
    """Mirror left-right with probability ``p`` (returns a view; ToTensor makes it contiguous)."""

    deterministic = False

    def __init__(self, p: float = recipes.FLIP_PROBABILITY, generator: torch.Generator | None = None) -> None:
        self.p = float(p)
        self.generator = generator

    def _params(self) -> dict[str, Any]:
        return {"p": self.p}

    def draw(self) -> bool:
        """Whether this sample is mirrored (one draw from the stage's generator)."""
        return _uniform(self.generator, 1)[0] < self.p

    def __call__(self, arr: np.ndarray) -> np.ndarray:
        return _mirror(arr) if self.draw() else arr


def _mirror(arr: np.ndarray) -> np.ndarray:
    if all(st >= 0 for st in arr.strides):
        # A contiguous mirrored copy: ~15x faster than NumPy copying the ``[:, ::-1]`` view of
        # 3-byte pixels later (0.02 vs 0.39 ms for 224x224x3 here), and torch needs positive strides.
        return torch.from_numpy(arr).flip(1).numpy()
    return np.ascontiguousarray(arr[:, ::-1])


class ToTensor(Stage):
    """HWC uint8 array -> CHW float32 torch tensor in [0, 1].

    Deterministic, but not part of the cached prefix: its float output is 4x the bytes of the
    uint8 input and cheap to recompute.
    """

    array_output = False

    def __call__(self, arr: np.ndarray) -> torch.Tensor:
        x = _chw_view(arr)
        # One pass that converts, scales and transposes into a contiguous CHW tensor (``.to()`` of
        # the permuted view would keep the HWC layout, and every later op would pay for the strides).
        return torch.div(x, 255.0, out=new_output(x.shape, torch.float32))


class Normalize(Stage):
    """``(x - mean) / std`` per channel on a CHW float tensor (in place on ToTensor's fresh output)."""

    array_output = False

    def __init__(self, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> None:
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        if any(s == 0 for s in self.std):
            raise ValueError(f"Normalize: std must be non-zero, got {self.std}")
        self._mean_t = torch.tensor(self.mean, dtype=torch.float32)[:, None, None]
        self._std_t = torch.tensor(self.std, dtype=torch.float32)[:, None, None]
        self._affine_cache: dict[tuple[int, float], tuple[torch.Tensor, torch.Tensor]] = {}

    def _params(self) -> dict[str, Any]:
        return {"mean": self.mean, "std": self.std}

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        # x * (1/std) - mean/std, in place (it differs from (x - mean) / std by float rounding).
        # mul_ and add_ with a (C, 1, 1) operand are vectorized; addcmul's broadcast was 4x slower.
        scale, shift = self._affine(t.shape[0], 1.0)
        return t.mul_(scale).add_(shift)

    def _affine(self, channels: int, input_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(scale, shift) with ``normalize(x * input_scale) == x * scale + shift``, per channel."""
        cached = self._affine_cache.get((channels, input_scale))
        if cached is not None:
            return cached
        if channels != len(self.mean) and len(self.mean) != 1:
            raise ValueError(f"Normalize: {len(self.mean)} means for an input with {channels} channels")
        out = (input_scale / self._std_t, -self._mean_t / self._std_t)
        self._affine_cache[(channels, input_scale)] = out
        return out


class _ToTensorNormalize:
    """[RandomHorizontalFlip +] ToTensor + Normalize, fused by :class:`Compose`: HWC uint8 to normalized CHW.

    With the C kernel (:data:`coordl.prep.cropdecode.to_chw_float`) an RGB array that is contiguous
    (what the resizes return) is mirrored, converted, scaled and shifted in one pass straight into
    the output, bit-identical to the stages' own ``copy_``, ``mul_``, ``add_`` (0.02 ms per 224x224 here
    instead of 0.06 from HWC, plus the flip's copy). Anything else takes the torch path.
    """

    def __init__(self, normalize: Normalize, flip: RandomHorizontalFlip | None = None) -> None:
        self.normalize = normalize
        self.flip = flip
        self._kernel_args: tuple[float, ...] | None = None

    def __call__(self, arr: np.ndarray) -> torch.Tensor:
        mirrored = self.flip is not None and self.flip.draw()
        kernel = cropdecode.to_chw_float
        if (
            kernel is not None
            and arr.ndim == 3
            and arr.shape[2] == 3
            and arr.dtype == np.uint8
            and arr.flags.c_contiguous
        ):
            out = self._kernel(kernel, arr, mirrored)
            if out is not None:
                return out
        x = _chw_view(_mirror(arr) if mirrored else arr)
        scale, shift = self.normalize._affine(x.shape[0], 1 / 255.0)
        # Convert, then scale and shift in place: 0.02 ms for 3x224x224 vs 0.07 for one broadcast addcmul.
        return new_output(x.shape, torch.float32).copy_(x).mul_(scale).add_(shift)

    def _kernel(self, kernel: Callable[..., None], arr: np.ndarray, mirrored: bool) -> torch.Tensor | None:
        h, w = arr.shape[:2]
        out = new_output((3, h, w), torch.float32)
        if not out.is_contiguous():
            return None
        if self._kernel_args is None:
            scale, shift = self.normalize._affine(3, 1 / 255.0)  # the float32 values torch's path uses
            self._kernel_args = (
                *scale.expand(3, 1, 1).flatten().tolist(),
                *shift.expand(3, 1, 1).flatten().tolist(),
            )
        kernel(arr, h, w, out.numpy(), *self._kernel_args, mirrored)
        return out


class _DecodeRandomResizedCrop:
    """Decode then RandomResizedCrop, fused by :class:`Compose`: decode only the crop's box.

    The box comes from ``crop.get_params`` on the header's size (the same random draws as the two
    stages make), so the unfused pipeline and this one crop the same boxes. Anything the crop decoder
    does not take (see :mod:`coordl.prep.cropdecode`) is decoded whole by ``decode`` and cropped.
    """

    def __init__(self, decode: Decode, crop: RandomResizedCrop) -> None:
        self.decode = decode
        self.crop = crop

    def __call__(self, raw: Any) -> np.ndarray:
        size = cropdecode.jpeg_size(raw)
        if size is None:
            return self.crop(self.decode(raw))
        top, left, h, w = self.crop.get_params(*size)
        th, tw = self.crop.size
        box = cropdecode.decode_crop(raw, top, left, h, w, (th, tw), self.decode.fastdct)
        if box is None:  # libjpeg objected: the full decode decides (and raises CorruptItemError)
            box = self.decode(raw)[top : top + h, left : left + w]
        return _resize(box, tw, th, compact=False)


def _chw_view(arr: np.ndarray) -> torch.Tensor:
    """A CHW torch view of an HWC (or HW) array; copies only an array torch cannot view."""
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if any(st < 0 for st in arr.strides):
        arr = arr.copy()  # not ascontiguousarray: it keeps a 1-pixel-wide mirrored view's negative stride
    return torch.from_numpy(arr).permute(2, 0, 1)


def _fuse(stages: list[Callable[[Any], Any]], crop_decode: bool = True) -> list[Callable[[Any], Any]]:
    """``stages`` with [RandomHorizontalFlip +] ToTensor + Normalize and (with ``crop_decode``) Decode() +
    RandomResizedCrop fused.

    A ``Decode`` with ``min_size`` is not fused: its output is not the header's size.
    """
    out: list[Callable[[Any], Any]] = []
    for stage in stages:
        prev = out[-1] if out else None
        if type(stage) is Normalize and type(prev) is ToTensor:
            before = out[-2] if len(out) > 1 else None
            if type(before) is RandomHorizontalFlip:
                del out[-1]
                out[-1] = _ToTensorNormalize(stage, before)
            else:
                out[-1] = _ToTensorNormalize(stage)
        elif (
            crop_decode
            and type(stage) is RandomResizedCrop
            and type(prev) is Decode
            and prev.min_size is None
        ):
            out[-1] = _DecodeRandomResizedCrop(prev, stage)
        else:
            out.append(stage)
    return out


def train_transform(size: int = 224, resize: int | None = None, *, recipe: str | None = None) -> Compose:
    """ImageNet training prep: ``recipe="standard"`` (the default) or ``"resize_first"``.

    - ``"standard"`` (torchvision's and DALI's): Decode -> RandomResizedCrop(size) of the
      full-resolution image -> RandomHorizontalFlip -> ToTensor -> Normalize. Run whole, the decode
      and the crop are fused: only the crop's box is decoded (:mod:`coordl.prep.cropdecode`), the
      cheapest prep per sample. With a sample cache, the cached prefix is the full decoded image.
    - ``"resize_first"``: Decode -> ResizeShorter(resize) -> the same random stages. The resize of
      every whole image costs about a third more CPU per sample than the standard recipe (and crops
      small boxes from a 256-pixel copy instead of the original), but the cached prefix is ~4x
      smaller than the full image: the choice when the sample cache (``memcache``) keeps prepped
      arrays. ``resize`` defaults to ``size / 0.875`` (256 for 224).

    Passing ``resize`` without ``recipe`` selects ``"resize_first"`` (what it meant before the
    standard recipe became the default).
    """
    if recipe is None:
        recipe = "resize_first" if resize is not None else "standard"
    if recipe not in TRAIN_RECIPES:
        raise ValueError(f"train_transform: recipe must be one of {TRAIN_RECIPES}, got {recipe!r}")
    random_stages = [RandomResizedCrop(size), RandomHorizontalFlip(), ToTensor(), Normalize()]
    if recipe == "standard":
        if resize is not None:
            raise ValueError("train_transform: resize= applies to recipe='resize_first' only")
        return Compose([Decode(), *random_stages])
    resize = resize or recipes.shorter_side_for(size)
    return Compose([Decode(min_size=resize), ResizeShorter(resize), *random_stages])


def eval_transform(size: int = 224, resize: int | None = None) -> Compose:
    """Standard ImageNet evaluation prep: Decode -> ResizeShorter(256) -> CenterCrop(224) -> tensor."""
    resize = resize or recipes.shorter_side_for(size)
    return Compose(
        [Decode(min_size=resize), ResizeShorter(resize), CenterCrop(size), ToTensor(), Normalize()]
    )

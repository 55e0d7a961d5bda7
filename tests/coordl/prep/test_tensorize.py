"""The recipe's last stages fused into one pass (``[flip +] ToTensor + Normalize``, the C kernel
``cropdecode.to_chw_float``) and the resize's output layout.

The fused stage must be bit-identical to the torch path it replaces (convert, ``mul_``, ``add_``), draw
the flip from the same generator in the same order, and fall back to torch for every input the kernel
does not take (greyscale, non-contiguous views, no extension).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coordl.prep import cropdecode
from coordl.prep import transforms as T
from coordl.ring.output_buffers import lend

needs_kernel = pytest.mark.skipif(
    cropdecode.to_chw_float is None, reason="coordl.prep._cropjpeg is not built"
)


def _pixels(shape=(61, 83, 3), seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def _torch_path(arr: np.ndarray, flip: bool, normalize: T.Normalize) -> torch.Tensor:
    x = T._chw_view(arr[:, ::-1] if flip else arr)
    scale, shift = normalize._affine(x.shape[0], 1 / 255.0)
    return torch.empty(x.shape).copy_(x).mul_(scale).add_(shift)


@needs_kernel
@pytest.mark.parametrize("shape", [(224, 224, 3), (61, 83, 3), (1, 1, 3), (2, 37, 3)])
@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("stats", [None, ((0.5,), (0.25,))])
def test_kernel_is_bit_identical_to_the_torch_path(shape, flip, stats):
    arr = _pixels(shape)
    normalize = T.Normalize(*stats) if stats else T.Normalize()
    fused = T.Compose([T.RandomHorizontalFlip(float(flip)), T.ToTensor(), normalize])
    out = fused(arr)
    assert out.shape == (3, *shape[:2]) and out.is_contiguous() and out.dtype == torch.float32
    assert torch.equal(out, _torch_path(arr, flip, normalize))
    unfused = normalize(T.ToTensor()(T.RandomHorizontalFlip(float(flip))(arr)))
    assert torch.allclose(out, unfused, atol=1e-5)  # (x / 255 - m) / s vs x * (1/255/s) - m/s: float rounding


def test_the_flip_draw_comes_from_its_generator_in_the_same_order():
    arr = _pixels()
    stages = lambda g: [T.RandomHorizontalFlip(generator=g), T.ToTensor(), T.Normalize()]  # noqa: E731
    fused = T.Compose(stages(torch.Generator().manual_seed(3)))
    plain = stages(torch.Generator().manual_seed(3))
    for _ in range(12):  # p = 0.5: both branches are taken
        ref = arr
        for stage in plain:
            ref = stage(ref)
        assert torch.allclose(fused(arr), ref, atol=1e-5)


@pytest.mark.parametrize(
    "arr",
    [
        _pixels((40, 50)),  # greyscale: one channel
        _pixels((40, 90, 3))[:, 10:60],  # a view (CenterCrop's output): not contiguous
        _pixels((40, 50, 3)).astype(np.float32),  # not uint8
    ],
    ids=["grey", "view", "float"],
)
def test_inputs_the_kernel_does_not_take_go_through_torch(arr):
    normalize = T.Normalize((0.5,), (0.25,))
    out = T.Compose([T.RandomHorizontalFlip(1.0), T.ToTensor(), normalize])(arr)
    ref = normalize(T.ToTensor()(T.RandomHorizontalFlip(1.0)(arr)))
    assert out.shape == ref.shape and torch.allclose(out, ref, atol=1e-5)


def test_without_the_kernel_the_torch_path_gives_the_same_tensor(monkeypatch):
    arr = _pixels()
    compose = T.Compose([T.RandomHorizontalFlip(1.0), T.ToTensor(), T.Normalize()])
    with_kernel = compose(arr)
    monkeypatch.setattr(cropdecode, "to_chw_float", None)
    assert torch.equal(compose(arr), with_kernel)


@needs_kernel
def test_the_kernel_writes_into_the_row_a_stacker_lends():
    arr = _pixels((20, 30, 3))
    batch = torch.zeros(2, 3, 20, 30)
    with lend(lambda shape, dtype: batch[1] if shape == (3, 20, 30) else None):
        out = T.Compose([T.ToTensor(), T.Normalize()])(arr)
    assert out.data_ptr() == batch[1].data_ptr()
    assert torch.equal(batch[1], _torch_path(arr, False, T.Normalize())) and not batch[0].any()


@needs_kernel
def test_the_kernel_rejects_buffers_of_the_wrong_size():
    out = np.empty((3, 4, 5), np.float32)
    with pytest.raises(ValueError, match="do not fit a 4x5 RGB image"):
        cropdecode.to_chw_float(bytes(4 * 5 * 3 - 1), 4, 5, out, 1, 1, 1, 0, 0, 0, False)
    with pytest.raises(ValueError, match="do not fit"):
        cropdecode.to_chw_float(bytes(4 * 5 * 3), 4, 5, out[:2], 1, 1, 1, 0, 0, 0, False)
    with pytest.raises(TypeError):
        cropdecode.to_chw_float(bytes(60), 4, 5, bytes(240), 1, 1, 1, 0, 0, 0, False)  # read-only output


@pytest.mark.parametrize("compact", [True, False])
def test_resize_returns_hwc_contiguous_pixels_equal_to_the_planar_route(compact):
    arr = _pixels((120, 90, 3))
    for src in (arr, arr[5:100, 7:80]):  # contiguous, and a crop's view
        out = T._resize(src, 64, 48, compact=compact)
        assert out.shape == (48, 64, 3) and out.flags.c_contiguous
        planar = torch.nn.functional.interpolate(
            torch.from_numpy(np.ascontiguousarray(src)).permute(2, 0, 1)[None].float(),
            size=(48, 64),
            mode="bilinear",
            antialias=True,
            align_corners=False,
        )[0].permute(1, 2, 0)
        assert np.abs(out.astype(np.float32) - planar.numpy()).max() <= 1  # uint8 kernel rounding
        ref = torch.nn.functional.interpolate(  # torch's uint8 kernel on a planar input
            torch.from_numpy(np.ascontiguousarray(src)).permute(2, 0, 1)[None].contiguous(),
            size=(48, 64),
            mode="bilinear",
            antialias=True,
            align_corners=False,
        )[0].permute(1, 2, 0)
        assert np.array_equal(out, ref.numpy())

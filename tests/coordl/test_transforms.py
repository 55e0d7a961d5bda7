"""coordl.transforms: decode paths, shapes, reproducible randomness, the cacheable split, errors."""

from __future__ import annotations

import io

import numpy as np
import pytest
import simplejpeg
import torch
from PIL import Image

from coordl.errors import CorruptItemError
from coordl.prep import transforms as T


def _pixels(h: int = 60, w: int = 80) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    return np.stack([xx * 3 % 256, yy * 4 % 256, (xx + yy) % 256], axis=-1).astype(np.uint8)


def _jpeg(arr: np.ndarray, quality: int = 95) -> bytes:
    return simplejpeg.encode_jpeg(arr, quality=quality, colorsubsampling="444")


def _pil_bytes(arr: np.ndarray, fmt: str, mode: str | None = None) -> bytes:
    img = Image.fromarray(arr)
    if mode:
        img = img.convert(mode)
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def test_jpeg_decode_matches_pillow():
    raw = _jpeg(_pixels())
    ours = T.Decode()(raw)
    ref = np.asarray(Image.open(io.BytesIO(raw)).convert("RGB"))
    assert ours.shape == (60, 80, 3) and ours.dtype == np.uint8
    assert np.abs(ours.astype(int) - ref.astype(int)).mean() < 2


def test_png_and_grayscale_and_cmyk_decode_to_rgb():
    arr = _pixels()
    assert np.array_equal(T.Decode()(_pil_bytes(arr, "PNG")), arr)
    gray = T.Decode()(_pil_bytes(arr, "JPEG", "L"))
    assert gray.shape == (60, 80, 3)
    cmyk = T.Decode()(_pil_bytes(arr, "JPEG", "CMYK"))  # simplejpeg refuses CMYK -> Pillow
    assert cmyk.shape == (60, 80, 3)


@pytest.mark.parametrize("raw", [b"", b"not an image at all", _jpeg(_pixels())[:300]])
def test_corrupt_bytes_raise_corrupt_item_error(raw):
    with pytest.raises(CorruptItemError, match="cannot decode"):
        T.Decode()(raw)


def test_dct_downscale_keeps_both_sides_above_min_size():
    raw = _jpeg(_pixels(600, 800))
    out = T.Decode(min_size=128)(raw)
    assert min(out.shape[:2]) >= 128 and out.shape[0] < 600
    # Not at least twice the target: full-size decode.
    assert T.Decode(min_size=400)(raw).shape == (600, 800, 3)


@pytest.mark.parametrize("shape,expect", [((60, 80, 3), (30, 40, 3)), ((80, 60, 3), (40, 30, 3))])
def test_resize_shorter(shape, expect):
    arr = np.zeros(shape, np.uint8)
    assert T.ResizeShorter(30)(arr).shape == expect


def test_center_crop_and_pad():
    arr = _pixels(60, 80)
    out = T.CenterCrop(20)(arr)
    assert out.shape == (20, 20, 3)
    assert np.array_equal(out, arr[20:40, 30:50])
    assert T.CenterCrop((70, 10))(arr).shape == (70, 10, 3)


def test_random_resized_crop_reproducible_by_torch_seed():
    arr = _pixels(120, 160)
    rrc = T.RandomResizedCrop(32)
    torch.manual_seed(1)
    a = [rrc(arr) for _ in range(4)]
    torch.manual_seed(1)
    b = [rrc(arr) for _ in range(4)]
    assert all(x.shape == (32, 32, 3) for x in a)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(a[0], x) for x in a[1:])


def test_random_resized_crop_params_in_bounds():
    rrc = T.RandomResizedCrop(16, scale=(0.5, 1.0))
    for _ in range(50):
        top, left, h, w = rrc.get_params(30, 200)  # extreme aspect: may need the fallback
        assert top >= 0 and left >= 0 and top + h <= 30 and left + w <= 200 and h > 0 and w > 0


def test_flip():
    arr = _pixels()
    assert np.array_equal(T.RandomHorizontalFlip(1.0)(arr), arr[:, ::-1])
    assert T.RandomHorizontalFlip(0.0)(arr) is arr


def test_to_tensor_and_normalize():
    arr = _pixels()
    t = T.ToTensor()(arr[:, ::-1])
    assert t.shape == (3, 60, 80) and t.dtype == torch.float32
    assert abs(float(t[0, 0, 0]) - arr[0, -1, 0] / 255.0) < 1e-6
    n = T.Normalize(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))(t.clone())
    assert torch.allclose(n, t * 2 - 1)
    with pytest.raises(ValueError, match="std"):
        T.Normalize(std=(1, 0, 1))


def test_flip_of_a_view_and_of_a_negative_stride_array():
    arr = _pixels()
    crop = arr[5:50, 10:70]  # a view, as CenterCrop returns
    assert np.array_equal(T.RandomHorizontalFlip(1.0)(crop), crop[:, ::-1])
    assert np.array_equal(T.RandomHorizontalFlip(1.0)(arr[::-1]), arr[::-1, ::-1])


def test_to_tensor_is_contiguous_chw_and_normalize_matches_the_textbook_formula():
    arr = _pixels()
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    ref = (
        torch.from_numpy(arr.astype(np.float32) / 255.0).permute(2, 0, 1) - torch.tensor(mean)[:, None, None]
    )
    ref = ref / torch.tensor(std)[:, None, None]
    t = T.ToTensor()(arr)
    assert t.is_contiguous() and t.shape == (3, 60, 80)
    assert torch.allclose(T.Normalize(mean, std)(t), ref, atol=1e-5)
    gray = T.ToTensor()(arr[:, :, 0])
    assert gray.shape == (1, 60, 80)
    with pytest.raises(ValueError, match="3 means for an input with 1 channels"):
        T.Normalize(mean, std)(gray)


def test_compose_fuses_to_tensor_and_normalize_with_the_same_result():
    arr = _pixels()
    stages = [T.RandomHorizontalFlip(1.0), T.ToTensor(), T.Normalize()]
    fused = T.Compose(stages)(arr)
    unfused = arr
    for stage in stages:
        unfused = stage(unfused)
    assert fused.is_contiguous() and torch.allclose(fused, unfused, atol=1e-5)
    comp = T.Compose([T.ToTensor(), T.Normalize()])
    comp(arr)
    comp.stages.pop()  # editing the public list re-plans: no stale fused stage
    assert torch.allclose(comp(arr), T.ToTensor()(arr))
    assert repr(comp) == "Compose([ToTensor()])"


def test_train_transform_resize_first_split_and_identity():
    tr = T.train_transform(64, recipe="resize_first")
    det, rest = tr.split()
    assert [type(s).__name__ for s in det] == ["Decode", "ResizeShorter"]
    assert [type(s).__name__ for s in rest] == [
        "RandomResizedCrop",
        "RandomHorizontalFlip",
        "ToTensor",
        "Normalize",
    ]
    assert "size=73" in repr(det) and "min_size=73" in repr(det)
    assert repr(det) != repr(T.train_transform(64, resize=80).split()[0])
    assert repr(T.train_transform(64, resize=73)) == repr(tr)  # resize= alone means resize-first
    raw = _jpeg(_pixels(120, 160))
    torch.manual_seed(3)
    whole = tr(raw)
    torch.manual_seed(3)
    parts = rest(det(raw))
    assert whole.shape == (3, 64, 64) and torch.equal(whole, parts)


def test_train_transform_standard_recipe_crops_the_full_resolution_image():
    tr = T.train_transform(64)
    assert [type(s).__name__ for s in tr] == [
        "Decode", "RandomResizedCrop", "RandomHorizontalFlip", "ToTensor", "Normalize",
    ]  # fmt: skip
    det, rest = tr.split()
    assert (
        repr(det) == "Compose([Decode(min_size=None, fastdct=False)])"
    )  # the sample cache keeps the full image
    crop = tr.stages[1]
    assert (crop.scale, crop.ratio) == ((0.08, 1.0), (3 / 4, 4 / 3))
    raw = _jpeg(_pixels(120, 160))
    torch.manual_seed(3)
    whole = tr(raw)  # crop decode (fused): boxes under 2x the output size decode to the same pixels
    torch.manual_seed(3)
    parts = rest(det(raw))
    assert whole.shape == (3, 64, 64) and torch.equal(whole, parts)


@pytest.mark.parametrize("kwargs", [{"recipe": "resize_first_please"}, {"recipe": "standard", "resize": 80}])
def test_train_transform_rejects_an_unknown_recipe_or_a_resize_it_would_ignore(kwargs):
    with pytest.raises(ValueError, match="recipe"):
        T.train_transform(64, **kwargs)


def test_eval_transform_is_deterministic():
    ev = T.eval_transform(32)
    raw = _jpeg(_pixels(120, 160))
    assert torch.equal(ev(raw), ev(raw)) and ev(raw).shape == (3, 32, 32)
    det, _ = ev.split()
    assert [type(s).__name__ for s in det] == ["Decode", "ResizeShorter", "CenterCrop"]


def test_dali_and_cpu_pipelines_share_their_parameters():
    from coordl.dali.ops import eval_pipeline, train_pipeline

    cpu, dali = T.train_transform(224), train_pipeline(224)
    crop, flip, norm = cpu.stages[1], cpu.stages[2], cpu.stages[4]
    assert (dali.scale, dali.ratio) == (crop.scale, crop.ratio) == ((0.08, 1.0), (3 / 4, 4 / 3))
    assert flip.p == 0.5 and tuple(dali.mean) == norm.mean and tuple(dali.std) == norm.std
    cpu_eval = T.eval_transform(224)
    assert cpu_eval.stages[1].size == 256 and eval_pipeline(224).resize is None  # DALI: the same 256
    assert T.train_transform(224, recipe="resize_first").stages[1].size == 256


def test_compose_pickles_with_its_crop_decode_choice():
    import pickle

    plain = T.Compose(list(T.train_transform(32)), crop_decode=False)
    again = pickle.loads(pickle.dumps(plain))
    assert again.crop_decode is False and repr(again) == repr(plain)
    state = T.train_transform(32).__getstate__()
    del state["crop_decode"]  # a Compose pickled before the option existed
    old = T.Compose.__new__(T.Compose)
    old.__setstate__(state)
    assert old.crop_decode is True and old(_jpeg(_pixels(120, 160))).shape == (3, 32, 32)

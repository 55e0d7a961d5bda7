"""Crop decode (coordl.prep.cropdecode + the fused Decode/RandomResizedCrop stage).

The box's pixels against a full decode, every JPEG flavour and non-JPEG input, corrupt and
truncated files, the missing-extension fallback, and the crop-box distribution against
torchvision's documented RandomResizedCrop rule (torchvision itself is not installable here).
"""

from __future__ import annotations

import io
import logging
import math

import numpy as np
import pytest
import simplejpeg
import torch
from PIL import Image

import coordl
from coordl.datasets.synth import make_image
from coordl.errors import CorruptItemError
from coordl.prep import cropdecode
from coordl.prep import transforms as T
from tests.coordl.prep.jpegs import jpeg_flavours, pil_jpeg

needs_ext = pytest.mark.skipif(not cropdecode.AVAILABLE, reason="coordl.prep._cropjpeg is not built")


_pil_jpeg = pil_jpeg
PIXELS = make_image(3, classes=10, width=203, height=141, seed=0)  # odd sizes: partial MCUs at the edges
FLAVOURS = jpeg_flavours(PIXELS)


def _boxes(height: int, width: int, n: int, seed: int = 0) -> list[tuple[int, int, int, int]]:
    rng = np.random.default_rng(seed)
    out = [(0, 0, height, width), (height - 1, width - 1, 1, 1), (0, width - 17, 9, 17)]
    for _ in range(n):
        h, w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
        out.append((int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w))
    return out


@needs_ext
@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
def test_box_pixels_equal_a_full_decode_cropped(flavour):
    raw = FLAVOURS[flavour]
    full = simplejpeg.decode_jpeg(raw, colorspace="RGB")
    assert cropdecode.jpeg_size(raw) == full.shape[:2]
    worst = 0
    for top, left, h, w in _boxes(*full.shape[:2], n=60):
        box = cropdecode.decode_crop(raw, top, left, h, w, out_size=(h, w))  # denom 1: no DCT scaling
        assert box is not None and box.shape == (h, w, 3)
        worst = max(worst, int(np.abs(box.astype(int) - full[top : top + h, left : left + w]).max()))
    assert worst <= 1  # measured 0: the same IDCT and upsampling (JPEG rounding allows 1)


@needs_ext
@pytest.mark.parametrize("denom", [2, 4, 8])
def test_dct_scaled_box_rounds_outwards_and_looks_like_the_downscaled_image(denom):
    big = make_image(5, classes=10, width=640, height=480, seed=0)
    raw = simplejpeg.encode_jpeg(big, quality=90, colorsubsampling="420")
    top, left, h, w = 37, 51, 400, 560
    out = (h // denom, w // denom)
    assert cropdecode.dct_denom(h, w, *out) == denom
    box = cropdecode.decode_crop(raw, top, left, h, w, out_size=out)
    rows = -(-(top + h) // denom) - top // denom
    cols = -(-(left + w) // denom) - left // denom
    assert box.shape == (rows, cols, 3)
    full = simplejpeg.decode_jpeg(raw, colorspace="RGB").astype(np.float32)
    t0, l0 = (top // denom) * denom, (left // denom) * denom
    ref = (
        full[t0 : t0 + rows * denom, l0 : l0 + cols * denom].reshape(rows, denom, cols, denom, 3).mean((1, 3))
    )
    assert np.abs(box - ref).mean() < 4  # a DCT-domain downscale is close to a box filter


def test_dct_denom_needs_twice_the_output_on_both_sides():
    assert cropdecode.dct_denom(447, 900, 224, 224) == 1
    assert cropdecode.dct_denom(448, 448, 224, 224) == 2
    assert cropdecode.dct_denom(900, 900, 224, 224) == 4
    assert cropdecode.dct_denom(4000, 4000, 224, 224) == 8


def _sof(marker: int, height: int, width: int, components: int = 3, precision: int = 8) -> bytes:
    """SOI, one frame header segment, EOI: enough for the header reader."""
    body = bytes([precision, height >> 8, height & 255, width >> 8, width & 255, components])
    body += b"\x01\x22\x00" * components
    return b"\xff\xd8\xff" + bytes([marker]) + (2 + len(body)).to_bytes(2, "big") + body + b"\xff\xd9"


@needs_ext
@pytest.mark.parametrize(
    "raw,expect",
    [
        *[(raw, (141, 203)) for raw in FLAVOURS.values()],
        (_pil_jpeg(PIXELS, "CMYK"), None),  # four components: libjpeg gives no RGB
        (FLAVOURS["420"] + b"x", None),  # not ending in EOI
        (FLAVOURS["420"][:300] + b"\xff\xd9", (141, 203)),  # the header is whole: the decoders judge the rest
        (_sof(0xC0, 9, 7), (9, 7)),
        (_sof(0xC2, 9, 7, components=1), (9, 7)),
        (_sof(0xC0, 0, 7), None),  # height from a DNL marker: not taken
        (_sof(0xC0, 9, 7, precision=12), None),
        (_sof(0xC0, 9, 7, components=4), None),
        (_sof(0xC3, 9, 7), None),  # lossless
        (b"\xff\xd8\xff\xff\xff" + _sof(0xC1, 9, 7)[3:], (9, 7)),  # fill bytes before a marker
        (b"\xff\xd8\xff\xda\x00\x04\x00\x00" + _sof(0xC0, 9, 7)[2:], None),  # a scan before the frame
        (b"\xff\xd8\xff\xe0\xff\xf0\x00\x00\xff\xd9", None),  # a segment longer than the data
        (_sof(0xC0, 9, 7)[:10] + b"\xff\xd9", None),  # a cut frame header
        (b"\xff\xd8\xff\xd9", None),
        (b"\x89PNG\r\n\x1a\n\xff\xd9", None),
    ],
)
def test_the_header_reader_takes_what_the_crop_decoder_takes(raw, expect):
    assert cropdecode.jpeg_size(raw) == expect
    assert cropdecode.jpeg_size(bytearray(raw)) == expect and cropdecode.jpeg_size(memoryview(raw)) == expect
    if expect is not None and len(raw) > 1000:  # the old reader agrees on whole files
        assert cropdecode._header_simplejpeg(raw) == expect


def test_a_build_without_the_header_reader_answers_through_simplejpeg(monkeypatch):
    monkeypatch.setattr(cropdecode, "_header", None)
    monkeypatch.setattr(cropdecode, "_cropjpeg", cropdecode._cropjpeg or object())
    assert cropdecode.jpeg_size(FLAVOURS["420"]) == (141, 203)
    assert cropdecode.jpeg_size(_pil_jpeg(PIXELS, "CMYK")) is None
    assert cropdecode.jpeg_size(FLAVOURS["420"][:-1]) is None


def _both(tf_size: int, raw: bytes, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(crop decode, full decode + crop) of the standard recipe, from the same random draws."""
    fused = T.train_transform(tf_size)
    plain = T.Compose(list(fused), crop_decode=False)
    torch.manual_seed(seed)
    a = fused(raw)
    torch.manual_seed(seed)
    return a, plain(raw)


@pytest.mark.parametrize(
    "raw",
    [
        *FLAVOURS.values(),
        _pil_jpeg(PIXELS, "CMYK"),  # simplejpeg refuses CMYK: Pillow decodes it whole
        FLAVOURS["420"] + b"trailing bytes",  # not ending in EOI: decoded whole
    ],
    ids=[*sorted(FLAVOURS), "cmyk", "after-eoi"],
)
def test_fused_standard_recipe_equals_full_decode_then_crop(raw):
    for seed in range(8):
        a, b = _both(80, raw, seed)  # boxes under 160 pixels high: no DCT scaling, the very same pixels
        assert a.shape == (3, 80, 80) and torch.equal(a, b)


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "WEBP"])
def test_non_jpeg_files_take_the_full_decode(fmt):
    buf = io.BytesIO()
    Image.fromarray(PIXELS).save(buf, format=fmt)
    assert cropdecode.jpeg_size(buf.getvalue()) is None
    a, b = _both(80, buf.getvalue(), seed=1)
    assert torch.equal(a, b)


@needs_ext
def test_dct_scaled_samples_stay_close_to_the_full_decode():
    raw = simplejpeg.encode_jpeg(make_image(7, 10, 1000, 750, 0), quality=90, colorsubsampling="420")
    diffs = []
    for seed in range(12):
        a, b = _both(224, raw, seed)
        diffs.append((a - b).abs().mean().item())
    # Normalized units (~1/58 per 8-bit level): measured means 0-0.05 (0-3 levels; 0 where denom 1).
    assert max(diffs) < 0.1 and min(diffs) == 0.0


@pytest.mark.parametrize(
    "raw",
    [
        FLAVOURS["420"][: len(FLAVOURS["420"]) // 2],  # truncated
        FLAVOURS["420"][:200],  # headers only
        FLAVOURS["420"][:300] + b"\xff\xd9",  # the frame header, then EOI: the crop decoder is tried first
        b"\xff\xd8\xff\xe0" + bytes(range(256)) * 8 + b"\xff\xd9",  # JPEG magic, garbage, EOI
        b"\xff\xd9",
        b"",
    ],
    ids=["truncated", "headers-only", "cut-with-eoi", "garbage", "eoi-only", "empty"],
)
def test_corrupt_and_truncated_files_raise_corrupt_item_error_naming_the_file(raw, tmp_path):
    (tmp_path / "cls").mkdir()
    (tmp_path / "cls" / "bad.jpg").write_bytes(raw)
    ds = coordl.ImageFolder(tmp_path, transform=T.train_transform(32))
    with pytest.raises(CorruptItemError) as info:
        ds.prep(ds.fetch(0), 0)
    assert info.value.path == str(tmp_path / "cls" / "bad.jpg") and "bad.jpg" in str(info.value)


@pytest.mark.parametrize(
    "damage",
    [b"\xff\xd3" * 4, bytes(np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8))],
    ids=["stray-restart-markers", "random-bytes"],
)
def test_damage_inside_the_box_is_judged_by_the_full_decode(damage):
    raw = bytearray(FLAVOURS["420"])
    at = raw.index(b"\xff\xda") + 100  # in the entropy-coded data of the first rows
    raw[at : at + len(damage)] = damage
    raw = bytes(raw)
    if cropdecode.AVAILABLE:  # libjpeg reports it: the crop decoder steps aside
        assert cropdecode.decode_crop(raw, 0, 0, 50, 50, (50, 50)) is None
    fused, plain = T.train_transform(80), T.Compose(list(T.train_transform(80)), crop_decode=False)
    for seed in range(4):
        outcomes = []
        for tf in (fused, plain):
            torch.manual_seed(seed)
            try:
                outcomes.append(tf(raw))
            except CorruptItemError as e:
                outcomes.append(str(e))
        if isinstance(outcomes[0], torch.Tensor):  # Pillow decodes what it can: the same for both
            assert torch.equal(outcomes[0], outcomes[1])
        else:
            assert outcomes[0] == outcomes[1] and "cannot decode image" in outcomes[0]


def test_without_the_extension_everything_decodes_whole_after_one_warning(monkeypatch, caplog):
    monkeypatch.setattr(cropdecode, "_cropjpeg", None)
    monkeypatch.setattr(cropdecode, "_warned", False)
    raw = FLAVOURS["420"]
    with caplog.at_level(logging.WARNING, logger="coordl.prep.cropdecode"):
        for seed in range(3):
            a, b = _both(48, raw, seed)  # whole decodes both: equal even where a crop decode would scale
            assert torch.equal(a, b)
        assert cropdecode.decode_crop(raw, 0, 0, 10, 10, (10, 10)) is None
    warnings = [r for r in caplog.records if "crop decoder" in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage()


# --- the crop-box distribution against torchvision's documented rule ----------------------------------


def _torchvision_rule(height, width, rng, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision.transforms.RandomResizedCrop.get_params as its documentation defines it.

    Area fraction uniform in ``scale``, log aspect ratio uniform in log ``ratio``, w = round(sqrt(A*r)),
    h = round(sqrt(A/r)); accept if it fits, with top/left uniform over the valid positions; after 10
    failures a centre crop of the whole image, clamped to ``ratio``.
    """
    area = height * width
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    if width / height < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif width / height > ratio[1]:
        h, w = height, round(height * ratio[1])
    else:
        h, w = height, width
    return (height - h) // 2, (width - w) // 2, h, w


def _ks(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic."""
    grid = np.union1d(a, b)
    cdf_a = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    cdf_b = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.abs(cdf_a - cdf_b).max())


@pytest.mark.parametrize("height,width", [(375, 500), (750, 1000), (40, 400)])
def test_crop_boxes_follow_torchvisions_distribution(height, width):
    n = 6000
    gen = torch.Generator().manual_seed(1)
    ours = np.array([T.RandomResizedCrop(224, generator=gen).get_params(height, width) for _ in range(n)])
    rng = np.random.default_rng(2)
    ref = np.array([_torchvision_rule(height, width, rng) for _ in range(n)])
    # Critical value of the two-sample KS test at alpha = 0.001: 1.95 * sqrt(2 / n).
    crit = 1.95 * math.sqrt(2 / n)
    top, left, h, w = ours.T
    rtop, rleft, rh, rw = ref.T
    for name, x, y in [
        ("area", h * w, rh * rw),
        ("aspect", w / h, rw / rh),
        ("top", top, rtop),
        ("left", left, rleft),
        ("bottom", top + h, rtop + rh),
    ]:
        assert _ks(x, y) < crit, name
    assert (top >= 0).all() and (top + h <= height).all() and (left + w <= width).all()
    # The centre-crop fallback: same box, about as often (binomial, 5 standard deviations).
    fallback = _torchvision_rule(height, width, np.random.default_rng(0), scale=(2.0, 2.0))
    ours_fb = (ours == fallback).all(axis=1).mean()
    ref_fb = (ref == fallback).all(axis=1).mean()
    p = max(ref_fb, 1 / n)
    assert abs(ours_fb - ref_fb) < 5 * math.sqrt(2 * p * (1 - p) / n) + 1 / n


def test_the_fused_stage_decodes_the_box_get_params_draws(monkeypatch):
    seen = []
    real = cropdecode.decode_crop

    def spy(raw, top, left, h, w, out_size, fastdct=False):
        seen.append((top, left, h, w))
        return real(raw, top, left, h, w, out_size, fastdct)

    monkeypatch.setattr(cropdecode, "decode_crop", spy)
    raw = FLAVOURS["420"]
    torch.manual_seed(4)
    T.train_transform(32)(raw)
    torch.manual_seed(4)
    expect = T.RandomResizedCrop(32).get_params(141, 203)
    assert seen == ([expect] if cropdecode.AVAILABLE else [])


# --- through the loaders ------------------------------------------------------------------------------


def test_standard_recipe_through_coordl_and_torch_loaders(image_root):
    ds = coordl.ImageFolder(image_root, transform=T.train_transform(32))
    torch_batches = list(torch.utils.data.DataLoader(ds, batch_size=5, num_workers=2))
    with coordl.DataLoader(ds, batch_size=5, num_workers=2, shuffle=True) as loader:
        labels = sorted(int(y) for _x, ys in loader for y in ys)
    assert labels == sorted(ds.targets)
    assert all(x.shape[1:] == (3, 32, 32) and x.dtype == torch.float32 for x, _ in torch_batches)


@pytest.mark.parametrize("recipe,side", [("standard", 48), ("resize_first", 37)])
def test_a_sample_cache_keeps_each_recipes_deterministic_prefix(recipe, side, image_root, tmp_path):
    from memcache import LocalStore

    store = LocalStore(16 << 20, name=f"crop{recipe}", directory=tmp_path)
    ds = coordl.ImageFolder(image_root, transform=T.train_transform(32, recipe=recipe))
    cached = ds.prep_deterministic(ds.fetch(0), 0)
    assert min(cached.shape[:2]) == side  # the full 64x48 image, or the copy resized to 37
    with coordl.DataLoader(ds, batch_size=6, num_workers=2, sample_cache=store) as loader:
        for _ in range(2):
            assert all(x.shape == (len(ys), 3, 32, 32) for x, ys in loader)
        st = loader.stats()
    store.close()
    assert st["sample_cache_misses"] == len(ds) and st["sample_cache_hits"] == len(ds)


def test_fastdct_is_passed_to_the_crop_decoder():
    fused = T.Compose([T.Decode(fastdct=True), T.RandomResizedCrop(80), T.ToTensor()])
    plain = T.Compose(list(fused), crop_decode=False)
    for seed in range(4):
        torch.manual_seed(seed)
        a = fused(FLAVOURS["420"])
        torch.manual_seed(seed)
        assert torch.equal(a, plain(FLAVOURS["420"]))  # both the fast integer IDCT

"""Crop-indexed JPEGs (coordl.prep.cropindex, ``coordl crop-index``) and the crop decoder's window.

The rewrite must be lossless for every decoder (simplejpeg and Pillow give the original's pixels),
keep EXIF and ICC markers, and refuse damaged input with an error naming the file; the crop decoder
must give the same box pixels from the rewritten file as from the original at every DCT scale, and
must really skip the segments outside the box (damage there goes unseen); torch's own DataLoader on the
original folder and coordl's on the rewritten one yield the same batches.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import pytest
import simplejpeg
import torch
from PIL import Image

import coordl
from coordl.datasets.synth import make_image
from coordl.errors import CorruptItemError
from coordl.prep import cropdecode, cropindex
from coordl.prep import transforms as T
from tests.coordl.prep.jpegs import jpeg_flavours, pil_jpeg

pytestmark = pytest.mark.skipif(
    not cropdecode.AVAILABLE or not hasattr(cropdecode._cropjpeg, "add_restarts"),
    reason="coordl.prep._cropjpeg is not built",
)


_pil = pil_jpeg
PIXELS = make_image(5, classes=10, width=203, height=141, seed=0)  # partial MCUs at the right and bottom
WIDE = make_image(6, classes=10, width=1000, height=750, seed=0)
FLAVOURS = {
    **jpeg_flavours(PIXELS),
    "500x375": simplejpeg.encode_jpeg(make_image(1, 10, 500, 375, 0), quality=90, colorsubsampling="420"),
}


def _decode(raw: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(raw)).convert("RGB"))


def _restart_interval(raw: bytes) -> int:
    at = raw.index(b"\xff\xdd")
    return raw[at + 4] << 8 | raw[at + 5]


def _boxes(height: int, width: int, n: int, seed: int) -> list[tuple[int, int, int, int]]:
    rng = np.random.default_rng(seed)
    out = [
        (0, 0, height, width),
        (height - 1, width - 1, 1, 1),
        (0, width - 17, 9, 17),
        (height - 9, 0, 9, 40),
    ]
    for _ in range(n):
        h, w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
        out.append((int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w))
    return out


@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
def test_the_rewrite_is_lossless_for_other_decoders(flavour):
    raw = FLAVOURS[flavour]
    out = cropindex.add_restarts(raw)
    assert out[:2] == b"\xff\xd8" and out[-2:] == b"\xff\xd9" and b"\xff\xdd" in out
    assert np.array_equal(_decode(out), _decode(raw))  # Pillow
    if flavour != "grey":
        assert np.array_equal(simplejpeg.decode_jpeg(out), simplejpeg.decode_jpeg(raw))
    assert b"\xff\xc2" not in out[: out.index(b"\xff\xda")]  # progressive input comes out baseline


@pytest.mark.parametrize(
    "segment_px,narrow,wide", [(8, 1, 1), (32, 2, 1), (48, 2, 3), (64, 4, 3), (1000, 32, 21)]
)
def test_segments_divide_each_row(segment_px, narrow, wide):
    # 500 px, 4:2:0: 32 MCUs of 16 px per row; 1000 px: 63 (divisors 1, 3, 7, 9, 21, 63). The interval is
    # the largest divisor whose segment fits in segment_px (one MCU at least).
    assert _restart_interval(cropindex.add_restarts(FLAVOURS["500x375"], segment_px)) == narrow
    wide_raw = simplejpeg.encode_jpeg(WIDE, quality=90, colorsubsampling="420")
    assert _restart_interval(cropindex.add_restarts(wide_raw, segment_px)) == wide


def test_exif_and_icc_markers_survive():
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation
    icc = b"fake ICC profile bytes " * 40
    raw = _pil(PIXELS, subsampling=2, exif=exif.tobytes(), icc_profile=icc)
    img = Image.open(io.BytesIO(cropindex.add_restarts(raw)))
    assert img.info["icc_profile"] == icc and img.getexif()[0x0112] == 6


@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
def test_crop_decode_of_the_rewrite_equals_the_original_box(flavour):
    raw = FLAVOURS[flavour]
    out = cropindex.add_restarts(raw, 16)
    full = simplejpeg.decode_jpeg(raw, colorspace="RGB") if flavour != "grey" else _decode(raw)
    height, width = full.shape[:2]
    for top, left, h, w in _boxes(height, width, 60, seed=1):
        box = cropdecode.decode_crop(out, top, left, h, w, (h, w))  # out_size = box: never DCT-scaled
        assert box is not None, (top, left, h, w)
        assert np.array_equal(box, full[top : top + h, left : left + w]), (top, left, h, w)


def test_dct_scaled_boxes_of_the_rewrite_equal_the_originals():
    raw = simplejpeg.encode_jpeg(WIDE, quality=90, colorsubsampling="420")
    out = cropindex.add_restarts(raw)
    denoms = set()
    for i, (top, left, h, w) in enumerate(_boxes(750, 1000, 80, seed=2)):
        k = (1, 3, 5, 9)[i % 4]  # outputs that give denom 1, 2, 4 and 8 where the box is big enough
        size = (max(h // k, 1), max(w // k, 1))
        denoms.add(cropdecode.dct_denom(h, w, *size))
        a = cropdecode.decode_crop(raw, top, left, h, w, size)
        b = cropdecode.decode_crop(out, top, left, h, w, size)
        assert a is not None and b is not None and np.array_equal(a, b), (top, left, h, w)
    assert denoms == {1, 2, 4, 8}


def test_segments_outside_the_window_are_not_decoded():
    """Bad Huffman codes in the first segment spoil a box that holds them, but a box far below decodes
    clean from the rewrite (its window leaves that segment out), where the original's crop decode
    entropy-decodes the damaged rows above the box, and their damage runs on into it."""
    bad = b"\xff\x00" * 10  # stuffed 0xFF bytes: a run of 1-bits, never a valid Huffman code
    raw = FLAVOURS["500x375"]
    out = bytearray(cropindex.add_restarts(raw))
    first_rst = out.index(b"\xff\xd0", out.index(b"\xff\xda"))
    out[first_rst - 40 : first_rst - 20] = bad  # inside segment 0 (the top-left 32x16 pixels)
    full = simplejpeg.decode_jpeg(raw)
    hit = cropdecode.decode_crop(bytes(out), 0, 0, 16, 32, (16, 16))
    assert hit is None or not np.array_equal(hit, full[:16, :32])
    box = cropdecode.decode_crop(bytes(out), 200, 250, 100, 120, (100, 120))
    assert box is not None and np.array_equal(box, full[200:300, 250:370])
    damaged = bytearray(raw)
    at = damaged.index(b"\xff\xda") + 100
    damaged[at : at + 20] = bad
    below = cropdecode.decode_crop(bytes(damaged), 200, 250, 100, 120, (100, 120))
    assert below is None or not np.array_equal(below, full[200:300, 250:370])  # no restart: no resync


def test_restart_markers_out_of_sequence_take_libjpegs_path():
    out = bytearray(cropindex.add_restarts(FLAVOURS["500x375"]))
    second = out.index(b"\xff\xd1", out.index(b"\xff\xda"))
    out[second + 1] = 0xD5  # RST5 where RST1 belongs
    # The window refuses the file; libjpeg itself then reports the marker (a warning): the caller's full
    # decode judges the file, as for any damaged JPEG.
    assert cropdecode.decode_crop(bytes(out), 300, 300, 50, 50, (50, 50)) is None


@pytest.mark.parametrize(
    "raw",
    [FLAVOURS["420"][: len(FLAVOURS["420"]) // 2], b"not a jpeg", b"\xff\xd8\xff\xe0" + bytes(300), b""],
    ids=["truncated", "not-jpeg", "garbage", "empty"],
)
def test_damaged_input_raises_corrupt_item_error_naming_it(raw):
    with pytest.raises(CorruptItemError) as info:
        cropindex.add_restarts(raw, name="cls/bad.jpg")
    assert info.value.path == "cls/bad.jpg" and "cls/bad.jpg" in str(info.value)


def test_segment_px_below_one_block_is_refused():
    with pytest.raises(ValueError, match="segment_px"):
        cropindex.add_restarts(FLAVOURS["420"], 4)


# --- index_tree and the command ----------------------------------------------------------------------


def _tree(root) -> dict[str, bytes]:
    (root / "a").mkdir(parents=True)
    (root / "b" / "deep").mkdir(parents=True)
    files = {
        "a/0.jpg": FLAVOURS["420"],
        "a/1.JPEG": FLAVOURS["progressive"],
        "b/deep/2.jpg": FLAVOURS["500x375"],
        "b/notes.txt": b"labels",
        "b/bad.jpg": FLAVOURS["420"][:500],
        "b/png-named.jpg": b"\x89PNG\r\n\x1a\n not really",
        "b/cmyk.jpg": _pil(PIXELS, "CMYK"),  # simplejpeg refuses it: --verify compares through Pillow
    }
    for name, data in files.items():
        (root / name).write_bytes(data)
    return files


def test_index_tree_rewrites_jpegs_copies_the_rest_and_reruns(tmp_path, caplog):
    files = _tree(tmp_path / "src")
    report = cropindex.index_tree(tmp_path / "src", tmp_path / "dst", workers=2, verify=True)
    assert (report.rewritten, report.copied, report.skipped) == (4, 3, 0)
    assert sorted(report.damaged) == ["b/bad.jpg", "b/png-named.jpg"]
    assert "b/bad.jpg" in caplog.text
    for name, data in files.items():
        new = (tmp_path / "dst" / name).read_bytes()
        if name in ("b/notes.txt", "b/bad.jpg", "b/png-named.jpg"):
            assert new == data
        else:
            assert b"\xff\xdd" in new and np.array_equal(_decode(new), _decode(data))
    assert not [p for p in (tmp_path / "dst").rglob("*") if ".coordl-tmp" in p.name]
    stale = tmp_path / "dst" / "a" / "0.jpg.coordl-tmp-999999"  # a run killed mid-write
    stale.write_bytes(b"half")
    again = cropindex.index_tree(tmp_path / "src", tmp_path / "dst", workers=1)
    assert not stale.exists()
    assert (again.rewritten, again.copied, again.skipped) == (0, 0, 7)


def test_in_place_replaces_jpegs_and_leaves_the_rest(tmp_path):
    files = _tree(tmp_path / "src")
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "src").rglob("*") if p.is_file()}
    report = cropindex.index_tree(tmp_path / "src", None, workers=2, in_place=True)
    assert (report.rewritten, report.copied, report.already) == (4, 0, 0)
    for name, data in files.items():
        now = (tmp_path / "src" / name).read_bytes()
        if name in ("b/notes.txt", "b/bad.jpg", "b/png-named.jpg"):
            assert (
                now == data
                and (tmp_path / "src" / name).stat().st_mtime_ns == before[tmp_path / "src" / name]
            )
        else:
            assert cropindex.is_crop_indexed(now) and np.array_equal(_decode(now), _decode(data))
    again = cropindex.index_tree(tmp_path / "src", tmp_path / "src", workers=1, in_place=True)
    assert (again.rewritten, again.already) == (0, 4)
    with pytest.raises(ValueError, match="give no destination"):
        cropindex.index_tree(tmp_path / "src", tmp_path / "elsewhere", in_place=True)


def test_an_interrupted_write_leaves_no_file(tmp_path, monkeypatch):
    _tree(tmp_path / "src")

    def fail(tmp, path):
        raise OSError("disk full")

    monkeypatch.setattr(cropindex.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        cropindex.index_tree(tmp_path / "src", tmp_path / "dst", workers=1)
    assert [p for p in (tmp_path / "dst").rglob("*") if p.is_file()] == []


def test_coordl_and_torch_loaders_agree_across_the_rewrite(image_root, tmp_path):
    cropindex.index_tree(image_root, tmp_path / "indexed", workers=1)
    original = coordl.ImageFolder(image_root, transform=T.train_transform(32))
    indexed = coordl.ImageFolder(tmp_path / "indexed", transform=T.train_transform(32))
    torch.manual_seed(3)
    ref = list(torch.utils.data.DataLoader(original, batch_size=4, num_workers=2))
    torch.manual_seed(3)
    with coordl.DataLoader(indexed, batch_size=4, num_workers=2) as loader:
        got = list(loader)
    assert len(got) == len(ref)
    for (xa, ya), (xb, yb) in zip(ref, got, strict=True):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    return subprocess.run(
        [sys.executable, "-m", "coordl.cli", "crop-index", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_the_command_reports_what_it_did_and_refuses_bad_folders(tmp_path):
    _tree(tmp_path / "src")
    done = _cli(str(tmp_path / "src"), str(tmp_path / "dst"), "--workers", "1", "--verify")
    assert done.returncode == 0, done.stderr
    assert (
        "4 JPEGs rewritten, 3 files copied as they were (2 damaged JPEGs left as they were), "
        "0 crop-indexed already, 0 already done" in done.stdout
    )
    again = _cli(str(tmp_path / "dst"), "--in-place", "--workers", "1")  # already crop-indexed: nothing to do
    assert again.returncode == 0 and "0 JPEGs rewritten (2 damaged" in again.stdout, again.stdout
    assert "4 crop-indexed already" in again.stdout
    neither = _cli(str(tmp_path / "src"))
    assert neither.returncode == 1 and "give a destination, or rewrite in place" in neither.stderr
    inside = _cli(str(tmp_path / "src"), str(tmp_path / "src" / "out"))
    assert inside.returncode == 1 and "must be outside the source" in inside.stderr
    missing = _cli(str(tmp_path / "nope"), str(tmp_path / "x"))
    assert missing.returncode == 1 and "is not a directory" in missing.stderr
    small = _cli(str(tmp_path / "src"), str(tmp_path / "y"), "--segment-px", "4")
    assert small.returncode == 2 and "--segment-px" in small.stderr


def test_damaged_crop_indexed_files_never_crash_the_decoder():
    """The window is cut from untrusted bytes in C: flipped bytes, stray markers, truncations and bad
    header lengths give a box of the right size or None (the full decode then judges), never a crash
    (this test was also run once under AddressSanitizer; see reports/bench_loader.md)."""
    rng = np.random.default_rng(7)
    clean = [cropindex.add_restarts(FLAVOURS[k], 16) for k in ("500x375", "420", "444", "grey")]
    for trial in range(1500):
        raw = bytearray(clean[trial % len(clean)])
        kind = trial % 5
        if kind == 0:  # random bytes anywhere (headers included)
            for at in rng.integers(2, len(raw) - 2, size=int(rng.integers(1, 8))):
                raw[at] = int(rng.integers(0, 256))
        elif kind == 1:  # a stray marker in the entropy-coded data
            at = int(rng.integers(raw.index(b"\xff\xda") + 10, len(raw) - 4))
            raw[at : at + 2] = bytes((0xFF, int(rng.choice([0xD0, 0xD3, 0xD7, 0xD9, 0xC4, 0xDA, 0xDD]))))
        elif kind == 2:  # cut short, with or without an EOI after the cut
            raw = raw[: int(rng.integers(4, len(raw)))] + (b"\xff\xd9" if trial % 2 else b"")
        elif kind == 3:  # a segment length in the headers
            at = int(rng.integers(2, raw.index(b"\xff\xda")))
            raw[at] = int(rng.integers(0, 256))
        else:  # the frame's size
            sof = raw.index(b"\xff\xc0")
            raw[sof + 5 + int(rng.integers(0, 4))] = int(rng.integers(0, 256))
        raw = bytes(raw)
        size = cropdecode.jpeg_size(raw)
        height, width = size if size is not None else (141, 203)
        h, w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
        top, left = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
        box = cropdecode.decode_crop(raw, top, left, h, w, (h, w))
        assert box is None or box.shape == (h, w, 3)


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_pack_with_crop_index_stores_rewritten_jpegs_that_train_the_same(image_root, tmp_path, fmt):
    from coordl.packing.pack import pack

    result = pack(
        coordl.ImageFolder(image_root), tmp_path / "p", fmt, shard_mb=0.02, progress=False, crop_index=True
    )
    assert result.ok
    packed = (
        coordl.LMDBDataset(str(tmp_path / "p")) if fmt == "lmdb" else coordl.TarShards(str(tmp_path / "p"))
    )
    folder = coordl.ImageFolder(image_root)
    assert len(packed) == len(folder)
    for i in range(len(folder)):
        raw = (
            bytes(packed.payload(packed.fetch(i), i))
            if hasattr(packed, "payload")
            else bytes(packed.fetch(i))
        )
        assert b"\xff\xdd" in raw[: raw.index(b"\xff\xda")]
        assert np.array_equal(_decode(raw), _decode(folder.fetch(i)))
    # torch's own DataLoader over the original folder, coordl's over the pack: the same batches
    packed.transform = T.train_transform(32)
    original = coordl.ImageFolder(image_root, transform=T.train_transform(32))
    torch.manual_seed(5)
    ref = list(torch.utils.data.DataLoader(original, batch_size=4, num_workers=2))
    torch.manual_seed(5)
    with coordl.DataLoader(packed, batch_size=4, num_workers=2) as loader:
        got = list(loader)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(ref, got, strict=True))
    with pytest.raises(FileExistsError):  # the same DST, without the rewrite: another pack
        pack(coordl.ImageFolder(image_root), tmp_path / "p", fmt, shard_mb=0.02, progress=False)


def test_a_real_photograph_and_foreign_restart_intervals():
    """matplotlib's sample photograph (an encoder nobody here wrote), and a file whose restart interval
    does not divide its rows (Pillow's restart_marker_blocks): the latter is not crop-indexed, decodes
    the old way with the same pixels, and the rewrite gives it a grid."""
    import matplotlib

    with open(f"{matplotlib.get_data_path()}/sample_data/grace_hopper.jpg", "rb") as f:
        photo = f.read()
    foreign = _pil(PIXELS, subsampling=2, restart_marker_blocks=5)  # 13 MCUs per row: 5 does not divide it
    for raw in (photo, foreign):
        assert not cropindex.is_crop_indexed(raw)
        out = cropindex.add_restarts(raw)
        assert cropindex.is_crop_indexed(out) and np.array_equal(_decode(out), _decode(raw))
        full = simplejpeg.decode_jpeg(raw, colorspace="RGB")
        height, width = full.shape[:2]
        for top, left, h, w in _boxes(height, width, 40, seed=3):
            for data in (raw, out):
                box = cropdecode.decode_crop(data, top, left, h, w, (h, w))
                assert box is not None and np.array_equal(box, full[top : top + h, left : left + w])

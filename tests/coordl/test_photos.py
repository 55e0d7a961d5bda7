"""coordl synth --photos: deterministic, ImageNet-like distributions, odd files that decode as Pillow does, clear errors."""

from __future__ import annotations

import dataclasses
import hashlib
import io
from collections import Counter

import numpy as np
import pytest
from PIL import Image

import coordl
from coordl.cli import main as cli_main
from coordl.datasets import photo_specs, photos


def _have_sources() -> bool:
    try:
        photos.source_paths()
    except FileNotFoundError:
        return False
    return True


needs_sources = pytest.mark.skipif(
    not _have_sources(),
    reason=f"source photographs not installed (apt-get install {' '.join(photos.PACKAGES)})",
)


def _digest(root) -> str:
    h = hashlib.sha256()
    for p in sorted(root.glob("class_*/*.JPEG")):
        h.update(p.relative_to(root).as_posix().encode() + p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return photos.make_dataset(tmp_path_factory.mktemp("photos") / "d", n=60, classes=4, seed=3, workers=2)


@needs_sources
def test_same_seed_same_bytes_and_layout(built, tmp_path):
    again = photos.make_dataset(tmp_path / "again", n=60, classes=4, seed=3, workers=1)
    assert _digest(again) == _digest(built)
    files = sorted(p.relative_to(built).as_posix() for p in built.glob("class_*/*.JPEG"))
    assert len(files) == 60 and files[0] == "class_000/000000.JPEG" and "class_003/000059.JPEG" in files
    ds = coordl.ImageFolder(built)  # ImageFolder takes ImageNet's upper-case .JPEG names
    assert len(ds) == 60 and ds.classes == ["class_000", "class_001", "class_002", "class_003"]
    # another seed: other files (checked on one file, without building a second dataset)
    pyramids = [photos._pyramid(str(p)) for p in photos.source_paths()]
    sizes = [pyr[0].size for pyr in pyramids]
    other = photo_specs.draw_spec(0, 4, sizes, {})
    assert photos.render(other, pyramids[other.source], 4) != (built / "class_000/000000.JPEG").read_bytes()
    with pytest.raises(FileExistsError, match="other parameters"):
        photos.make_dataset(built, n=61, classes=4, seed=3)


def test_drawn_distributions_follow_the_stated_shares():
    """20,000 specs (no pixels): each share within a few points of the one photo_specs states."""
    sizes = [(2560, 1600)] * 3
    n = 20_000
    odd = photo_specs.odd_positions(n, 0)
    specs = [photo_specs.draw_spec(i, 0, sizes, odd) for i in range(n)]
    long_side = np.array([max(s.width, s.height) for s in specs])
    assert abs(np.mean(long_side == 500) - photo_specs.P_LONG_SIDE_500) < 0.02
    assert long_side.min() >= photo_specs.LONG_SIDE_MIN and long_side.max() > 1500  # a long tail
    assert 400 < np.mean([s.width for s in specs]) < 500 and 330 < np.mean([s.height for s in specs]) < 420
    assert abs(np.mean([s.quality == 96 for s in specs]) - photo_specs.P_QUALITY[0]) < 0.02
    assert min(s.quality for s in specs) < 50
    chroma = Counter(s.subsampling for s in specs)
    assert abs(chroma["4:4:4"] / n - photo_specs.P_SUBSAMPLING[0]) < 0.02 and chroma["4:2:2"] > 0
    kinds = Counter(s.kind for s in specs)
    assert abs(kinds["gray"] / n - photo_specs.P_GRAY) < 0.006
    assert abs(kinds["progressive"] / n - photo_specs.P_PROGRESSIVE) < 0.005
    assert kinds["cmyk"] == 1 and kinds["png"] == 1  # ImageNet's 22 and 1 per 1.28M, at least one each
    assert photo_specs.odd_positions(photo_specs.MIN_N_FOR_ODD - 1, 0) == {}
    big = photo_specs.odd_positions(photo_specs.IMAGENET_TRAIN_FILES, 0)
    assert Counter(big.values()) == {"cmyk": 22, "png": 1}


@needs_sources
def test_file_sizes_are_photographic_and_spread(built):
    s = photos.summary(built)
    pct = s["bytes_percentiles"]
    assert 25_000 < pct[50] < 200_000, pct  # ImageNet: ~115 KB mean
    assert pct[90] / pct[10] > 4, pct  # sizes spread over orders of magnitude, not one size
    assert s["kinds"].get("JPEG CMYK") == 1 and s["kinds"].get("PNG RGB") == 1, s["kinds"]


@needs_sources
@pytest.mark.parametrize("kind", ["rgb", "gray", "progressive", "cmyk", "png"])
def test_every_kind_decodes_with_coordl_as_with_pillow(kind):
    paths = photos.source_paths()
    pyramid = photos._pyramid(str(paths[0]))
    spec = photo_specs.draw_spec(7, 0, [pyramid[0].size] * len(paths), {})
    spec = dataclasses.replace(spec, source=0, kind=kind, subsampling="4:2:0", width=120, height=90)
    spec = dataclasses.replace(spec, box=(10.0, 20.0, 10.0 + 120 * 3, 20.0 + 90 * 3))
    raw = photos.render(spec, pyramid, 0)
    with Image.open(io.BytesIO(raw)) as im:
        assert (im.format, im.mode) == {
            "png": ("PNG", "RGB"),
            "gray": ("JPEG", "L"),
            "cmyk": ("JPEG", "CMYK"),
        }.get(kind, ("JPEG", "RGB"))
        assert bool(im.info.get("progressive")) == (kind == "progressive")
        expected = np.asarray(im.convert("RGB"))
    got = coordl.transforms.Decode()(raw)
    assert got.shape == expected.shape == (90, 120, 3)
    diff = np.abs(got.astype(int) - expected).max()
    # simplejpeg (libjpeg-turbo) converts CMYK to RGB itself and rounds one level off Pillow
    assert diff <= (1 if kind == "cmyk" else 0)
    out = coordl.transforms.train_transform(64)(raw)  # the standard prep takes every kind
    assert tuple(out.shape) == (3, 64, 64)


def test_missing_photographs_name_the_packages(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="plasma-workspace-wallpapers mate-backgrounds"):
        photos.make_dataset(tmp_path / "d", n=5, classes=2, system_root=tmp_path / "bare")
    assert not (tmp_path / "d" / photos.MARKER).exists()
    assert cli_main(["synth", str(tmp_path / "e"), "--photos", "--size", "40x30"]) == 1
    assert "argument --size: not used with --photos" in capsys.readouterr().err


@needs_sources
def test_cli_reports_what_it_wrote(built, capsys):
    """Same parameters on a built dataset: returns at once and prints its summary."""
    args = ["synth", str(built), "--photos", "--n", "60", "--classes", "4", "--seed", "3"]
    assert cli_main(args) == 0
    out = capsys.readouterr().out
    assert "60 photographs in 4 classes" in out and "'JPEG CMYK': 1" in out and "'PNG RGB': 1" in out

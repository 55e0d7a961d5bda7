"""Fixtures of the packed-source tests (one tiny ImageFolder and its LMDB and tar packs), and the JPEG
flavours the crop decoder's tests run on."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

import coordl
from coordl.data.pack import pack
from coordl.data.synth import make_dataset

N_ITEMS = 24
N_CLASSES = 3


@pytest.fixture(scope="session")
def image_root(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("synth")
    return str(make_dataset(root, n=N_ITEMS, classes=N_CLASSES, width=64, height=48, seed=0, workers=1))


@pytest.fixture(scope="session")
def lmdb_path(image_root, tmp_path_factory) -> str:
    dst = str(tmp_path_factory.mktemp("packed") / "train.lmdb")
    assert pack(coordl.ImageFolder(image_root), dst, "lmdb", progress=False).ok
    return dst


@pytest.fixture(scope="session")
def tar_pattern(image_root, tmp_path_factory) -> str:
    dst = str(tmp_path_factory.mktemp("packed") / "shards")
    # ~10 KB per shard: 24 small JPEGs spread over several shards, so shard boundaries are exercised.
    result = pack(coordl.ImageFolder(image_root), dst, "tar", shard_mb=0.01, progress=False)
    assert result.ok and result.pattern.endswith("}.tar")
    return result.pattern


def pil_jpeg(arr: np.ndarray, mode: str = "RGB", **options) -> bytes:
    """``arr`` encoded by Pillow (quality 90) after conversion to ``mode``."""
    buf = io.BytesIO()
    Image.fromarray(arr).convert(mode).save(buf, format="JPEG", quality=90, **options)
    return buf.getvalue()


def jpeg_flavours(pixels: np.ndarray) -> dict[str, bytes]:
    """``pixels`` as each JPEG flavour the crop decoder must handle: chroma subsampling 4:2:0 / 4:2:2 /
    4:4:4, greyscale, progressive, and restart markers every MCU row."""
    return {
        "420": pil_jpeg(pixels, subsampling=2),
        "422": pil_jpeg(pixels, subsampling=1),
        "444": pil_jpeg(pixels, subsampling=0),
        "grey": pil_jpeg(pixels, "L"),
        "progressive": pil_jpeg(pixels, subsampling=2, progressive=True),
        "restart": pil_jpeg(pixels, subsampling=2, restart_marker_rows=1),
    }

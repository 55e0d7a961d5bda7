"""Fixtures for coordl.dali: small real JPEG folders (each test module skips itself without DALI)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import simplejpeg

from coordl.datasets.synth import make_dataset


@pytest.fixture(scope="session")
def jpeg_folder(tmp_path_factory) -> str:
    """40 synthetic 64x48 JPEGs in 4 classes (an ImageFolder root)."""
    return str(make_dataset(tmp_path_factory.mktemp("dali-ds"), n=40, classes=4, width=64, height=48, seed=0))


@pytest.fixture(scope="session")
def gray_folder(tmp_path_factory) -> str:
    """8 uniform JPEGs of known colour, class i has value 40 + 50 * i in every channel."""
    root = tmp_path_factory.mktemp("dali-gray")
    for c in range(2):
        os.makedirs(root / f"c{c}")
        value = 40 + 50 * c
        image = np.full((40, 40, 3), value, dtype=np.uint8)
        for k in range(4):
            (root / f"c{c}" / f"{k}.jpg").write_bytes(simplejpeg.encode_jpeg(image, quality=95))
    return str(root)

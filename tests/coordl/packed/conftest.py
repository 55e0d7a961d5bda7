"""Fixtures of the packed-source tests: one tiny ImageFolder and its LMDB and tar packs (the packer's and
the crop decoder's tests use them too)."""

from __future__ import annotations

import pytest

import coordl
from coordl.datasets.synth import make_dataset
from coordl.packing.pack import pack

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

"""Fixtures of the object-store tests: one moto S3 server (tests/support/s3server.py) holding a tiny dataset."""

from __future__ import annotations

import pytest

import coordl
from coordl.datasets.synth import make_dataset
from coordl.packing.pack import pack
from tests.support.s3server import S3Server, s3server_missing_reason

N_ITEMS = 24
N_CLASSES = 3
BUCKET = "data"


@pytest.fixture(autouse=True)
def _listing_cache(tmp_path, monkeypatch):
    """Listings go to this test's directory, never to ~/.cache (and never leak between tests)."""
    monkeypatch.setenv("COORDL_CACHE_DIR", str(tmp_path / "coordl-cache"))


@pytest.fixture(scope="session")
def image_root(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("synth")
    return str(make_dataset(root, n=N_ITEMS, classes=N_CLASSES, width=64, height=48, seed=0, workers=1))


@pytest.fixture(scope="module")
def s3(image_root):
    """A running server on loopback with ``s3://data/train`` = ``image_root``."""
    reason = s3server_missing_reason()
    if reason:
        pytest.skip(reason)
    with S3Server() as srv:
        srv.create_bucket(BUCKET)
        srv.upload_dir(image_root, BUCKET, "train")
        yield srv


@pytest.fixture(scope="module")
def packed(s3, image_root, tmp_path_factory):
    """``s3://data/shards/`` (tar shards with their .idx) and ``s3://data/lmdb/train.lmdb`` in the bucket."""
    out = tmp_path_factory.mktemp("packed")
    tar = pack(coordl.ImageFolder(image_root), str(out / "shards"), "tar", shard_mb=0.01, progress=False)
    assert tar.ok
    assert pack(coordl.ImageFolder(image_root), str(out / "lmdb" / "train.lmdb"), "lmdb", progress=False).ok
    s3.upload_dir(out / "shards", BUCKET, "shards")
    s3.upload_dir(out / "lmdb", BUCKET, "lmdb")
    return {"pattern": tar.pattern, "local": str(out)}

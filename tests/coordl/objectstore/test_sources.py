"""Bucket datasets against a real S3 server: listing, reads, counters, errors, every loader on top."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import coordl
from coordl.objectstore import ObjectStore, S3Source, StoreUnavailableError
from tests.coordl.objectstore.conftest import BUCKET, N_ITEMS


def _ident(raw: bytes) -> bytes:
    return raw


# decode, then a fixed size so that batches stack
_SMALL = coordl.transforms.Compose(
    [coordl.transforms.Decode(), coordl.transforms.ResizeShorter(32), coordl.transforms.CenterCrop(32),
     coordl.transforms.ToTensor()]
)  # fmt: skip


def test_imagefolder_streams_the_same_items_as_local(s3, image_root):
    local = coordl.ImageFolder(image_root, transform=_ident)
    remote = coordl.ImageFolder("s3://data/train", transform=_ident, storage_options=s3.storage_options())
    assert remote.classes == local.classes
    assert [t for _, t in remote.items] == [t for _, t in local.items]
    assert [p for p, _ in remote.items] == [p for p, _ in local.items]
    for i in (0, len(local) - 1):
        assert remote[i] == local[i]
    assert remote.describe(0) == f"s3://data/train/{local.items[0][0]}"
    stats = remote.stats()
    assert stats["store_requests"] == 1 + 2  # one LIST page, two GETs
    assert stats["store_bytes"] == len(local[0][0]) + len(local[len(local) - 1][0])


def test_listing_is_cached_with_the_dataset_identity(s3):
    first = coordl.ImageFolder("s3://data/train", storage_options=s3.storage_options())
    again = coordl.ImageFolder("s3://data/train", storage_options=s3.storage_options())
    assert again.stats()["store_requests"] == 0  # listed from the cache, not the server
    assert again.dataset_identity() == first.dataset_identity()
    client = s3.client()
    body = client.get_object(Bucket=BUCKET, Key="train/" + first.items[0][0])["Body"].read()
    client.put_object(Bucket=BUCKET, Key="train/class_000/zz_new.jpg", Body=body)
    try:
        stale = coordl.ImageFolder("s3://data/train", storage_options=s3.storage_options())
        assert len(stale) == len(first)  # a fresh cached listing is trusted...
        fresh = coordl.ImageFolder(
            "s3://data/train", storage_options=s3.storage_options(), refresh_listing=True
        )
        assert len(fresh) == len(first) + 1  # ...until asked to list again
        assert fresh.dataset_identity() != first.dataset_identity()
    finally:
        client.delete_object(Bucket=BUCKET, Key="train/class_000/zz_new.jpg")


def test_missing_key_names_the_object(s3):
    store = ObjectStore("s3://data/train", s3.storage_options())
    with pytest.raises(FileNotFoundError, match=r"s3://data/train/nope\.jpg: no such object"):
        store.get("train/nope.jpg")
    assert store.stats()["store_retries"] == 0
    with pytest.raises(FileNotFoundError, match="no such bucket"):
        coordl.ImageFolder("s3://no-such-bucket/train", storage_options=s3.storage_options())


def test_empty_prefix_is_a_clear_error(s3):
    with pytest.raises(FileNotFoundError, match="no files"):
        coordl.ImageFolder("s3://data/nothing-here", storage_options=s3.storage_options())


def test_bad_credentials_are_one_clear_error(s3):
    bad = s3.storage_options(aws_secret_access_key="wrong")
    with pytest.raises(PermissionError) as info:
        coordl.ImageFolder("s3://data/train", storage_options=bad, refresh_listing=True)
    text = str(info.value)
    assert "s3://data/train" in text and "SignatureDoesNotMatch" in text and "storage_options" in text
    store = ObjectStore("s3://data/train", bad)
    with pytest.raises(PermissionError):
        store.get("train/x.jpg")
    assert store.stats()["store_requests"] == 1  # refused credentials are never retried


def test_credentials_from_the_environment(s3, monkeypatch):
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    ds = coordl.ImageFolder("s3://data/train", transform=_ident)  # no storage_options at all
    assert len(ds) == N_ITEMS and len(ds[0][0]) > 0


def test_credentials_from_the_aws_config_files(s3, tmp_path, monkeypatch):
    (tmp_path / "credentials").write_text(
        f"[train]\naws_access_key_id = {s3.access_key}\naws_secret_access_key = {s3.secret_key}\n"
    )
    (tmp_path / "config").write_text(f"[profile train]\nregion = us-east-1\nendpoint_url = {s3.endpoint}\n")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    ds = coordl.ImageFolder("s3://data/train", transform=_ident, storage_options={"profile": "train"})
    assert len(ds) == N_ITEMS and len(ds[1][0]) > 0


def test_s3fs_style_storage_options(s3):
    opts = {"key": s3.access_key, "secret": s3.secret_key, "client_kwargs": {"endpoint_url": s3.endpoint}}
    assert len(coordl.ImageFolder("s3://data/train", storage_options=opts)) == N_ITEMS
    with pytest.raises(ValueError, match="unknown option"):
        coordl.ImageFolder("s3://data/train", storage_options={"endpoint": s3.endpoint, "bogus": 1})


def test_file_list_of_s3_keys(s3, image_root):
    local = coordl.ImageFolder(image_root, transform=_ident)
    urls = [f"s3://{BUCKET}/train/{rel}" for rel, _ in local.items[:5]]
    ds = coordl.FileListDataset(urls, targets=[t for _, t in local.items[:5]], transform=_ident,
                                storage_options=s3.storage_options())  # fmt: skip
    assert [ds[i] for i in range(5)] == [local[i] for i in range(5)]
    assert ds.stats()["store_requests"] == 5


def test_thread_safe_fetch_overlaps_requests(s3):
    ds = coordl.ImageFolder("s3://data/train", transform=_ident, storage_options=s3.storage_options())
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as ex:
        got = list(ex.map(ds.fetch, range(len(ds))))
    assert got == [ds.fetch(i) for i in range(len(ds))]


@pytest.mark.parametrize("workers", [0, 2])
def test_coordl_loader_minio_cache_stops_requests(s3, workers):
    ds = coordl.ImageFolder(
        "s3://data/train", transform=_SMALL,
        storage_options=s3.storage_options(),
    )  # fmt: skip
    loader = coordl.DataLoader(ds, batch_size=4, shuffle=True, num_workers=workers, cache_bytes=64 << 20)
    try:
        before = loader.stats()["store_requests"]
        n1 = sum(len(y) for _, y in loader)
        after1 = loader.stats()["store_requests"]
        n2 = sum(len(y) for _, y in loader)
        after2 = loader.stats()["store_requests"]
    finally:
        loader.close()
    assert n1 == n2 == N_ITEMS
    assert after1 - before == N_ITEMS  # one GET per item in epoch 1 (counted across worker processes)
    assert after2 == after1  # epoch 2 from the MinIO cache: no request


def test_torch_dataloader_over_a_bucket(s3):
    ds = coordl.ImageFolder("s3://data/train", storage_options=s3.storage_options(),
                            transform=_SMALL)  # fmt: skip
    loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2)
    shapes = [tuple(x.shape) for x, _ in loader]
    assert sum(s[0] for s in shapes) == N_ITEMS


def test_staging_from_a_bucket(s3, image_root, tmp_path):
    stage = tmp_path / "stage"
    ds = coordl.ImageFolder("s3://data/train", stage_dir=stage, transform=_ident,
                            storage_options=s3.storage_options())  # fmt: skip
    first = [ds[i] for i in range(len(ds))]
    requests = ds.stats()["store_requests"]
    assert [ds[i] for i in range(len(ds))] == first
    assert ds.stats()["store_requests"] == requests  # second pass: staged copies only
    assert ds.stats()["staged_items"] == N_ITEMS


def test_coordl_stage_cli_copies_a_bucket(s3, image_root, tmp_path, monkeypatch):
    from coordl.cli import main

    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    dst = tmp_path / "staged"
    assert main(["stage", "s3://data/train", str(dst), "--no-progress"]) == 0
    local = coordl.ImageFolder(image_root, transform=_ident)
    copy = coordl.ImageFolder(dst, transform=_ident)
    assert [copy[i] for i in range(len(copy))] == [local[i] for i in range(len(local))]


def test_server_killed_mid_epoch_is_a_clear_error_and_caches_nothing_partial(image_root):
    from tests.support.s3server import S3Server

    with S3Server() as srv:
        srv.create_bucket(BUCKET)
        srv.upload_dir(image_root, BUCKET, "train")
        ds = coordl.ImageFolder("s3://data/train", transform=_ident, storage_options=srv.storage_options())
        store: ObjectStore = ds._bucket.store
        store.attempts, store.backoff_s = 4, 0.05
        assert ds.fetch(0)
        srv.kill()
        with pytest.raises(StoreUnavailableError) as info:
            ds.fetch(1)
        assert ds.items[1][0] in str(info.value) and "after 4 attempts" in str(info.value)
        assert ds.stats()["store_retries"] == 3


@pytest.mark.slow
def test_killed_server_through_the_loader(image_root):
    from tests.support.s3server import S3Server

    with S3Server() as srv:
        srv.create_bucket(BUCKET)
        srv.upload_dir(image_root, BUCKET, "train")
        ds = coordl.ImageFolder("s3://data/train", transform=_ident, storage_options=srv.storage_options())
        ds._bucket.store.attempts, ds._bucket.store.backoff_s = 3, 0.05
        loader = coordl.DataLoader(ds, batch_size=4, num_workers=2, cache_bytes=64 << 20,
                                   collate_fn=lambda b: b)  # fmt: skip
        try:
            it = iter(loader)
            first = next(it)
            srv.kill()
            with pytest.raises(Exception, match=r"s3://data/train/.*after 3 attempts"):
                for _ in it:
                    pass
            hits_possible = loader.stats()
        finally:
            loader.close()
        assert len(first) == 4
        assert hits_possible["store_retries"] >= 2


def test_a_bucket_needs_no_stage_dir_but_other_urls_still_do(tmp_path):
    with pytest.raises(ValueError, match="stage_dir"):
        coordl.ImageFolder("memory://x/train")
    with pytest.raises(ValueError, match="storage_options"):
        coordl.ImageFolder(str(tmp_path), storage_options={})


def test_s3source_is_a_staging_source(s3):
    src = S3Source("s3://data/train", s3.storage_options())
    files = src.list_files()
    assert len(files) == N_ITEMS and all(not f.relpath.startswith("/") for f in files)
    assert src.read_range(files[0].relpath, 0, 2) == b"\xff\xd8"  # a JPEG's first bytes, one ranged GET
    with pytest.raises(ValueError):
        src.read("../secret")
    assert np.all([f.size > 0 for f in files]) and os.sep == "/"


def test_an_unknown_profile_is_one_clear_error(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    with pytest.raises(ValueError, match=r"s3://data/train: cannot set up the S3 client: .*nosuch"):
        coordl.ImageFolder("s3://data/train", storage_options={"profile": "nosuch"})

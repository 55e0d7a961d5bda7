"""Tar shards and LMDB from a bucket: whole-shard GETs (not one per sample), staging, the shard-window sampler."""

from __future__ import annotations

import os

import pytest

import coordl
from tests.coordl.objectstore.conftest import BUCKET, N_ITEMS


def _ident(raw: bytes) -> bytes:
    return raw


def _shard_count(packed) -> int:
    return sum(n.endswith(".tar") for n in os.listdir(os.path.join(packed["local"], "shards")))


def test_tar_shards_from_a_bucket_fetch_whole_shards(s3, packed):
    local = coordl.TarShards(packed["pattern"], transform=_ident)
    name = os.path.basename(packed["pattern"])
    remote = coordl.TarShards(f"s3://{BUCKET}/shards/{name}", transform=_ident,
                              storage_options=s3.storage_options())  # fmt: skip
    assert len(remote) == len(local) == N_ITEMS
    assert remote.dataset_identity().split(":")[-2:] == local.dataset_identity().split(":")[-2:]
    # construction: one LIST and one GET per uploaded .idx, no shard (coordl pack's index serves)
    assert remote.stats()["store_requests"] == 1 + _shard_count(packed)
    before = remote.stats()["store_requests"]
    got = [remote[i] for i in range(len(remote))]  # shard order: each shard once
    assert got == [local[i] for i in range(len(local))]
    assert remote.stats()["store_requests"] - before == _shard_count(packed)
    assert remote.describe(0).startswith(f"s3://{BUCKET}/shards/")


def test_tar_index_built_when_the_bucket_has_none(s3, packed, tmp_path):
    client = s3.client()
    names = sorted(n for n in os.listdir(os.path.join(packed["local"], "shards")) if n.endswith(".tar"))
    for n in names:
        with open(os.path.join(packed["local"], "shards", n), "rb") as f:
            client.put_object(Bucket=BUCKET, Key=f"noidx/{n}", Body=f.read())
    ds = coordl.TarShards(f"s3://{BUCKET}/noidx", transform=_ident, storage_options=s3.storage_options(),
                          index_dir=tmp_path / "idx")  # fmt: skip
    assert len(ds) == N_ITEMS
    assert sorted(os.listdir(tmp_path / "idx")) == [n + ".idx" for n in names]  # kept for the next run


def test_shard_sampler_with_workers_requests_shards_not_samples(s3, packed):
    name = os.path.basename(packed["pattern"])
    ds = coordl.TarShards(f"s3://{BUCKET}/shards/{name}", storage_options=s3.storage_options(),
                          transform=_ident, memory_shards=4)  # fmt: skip
    sampler = coordl.ShardSampler(ds, window=2, seed=1, batch_size=4, num_workers=2)
    order = list(sampler)
    assert sorted(order) == list(range(N_ITEMS)) and order != list(range(N_ITEMS))
    loader = coordl.DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2, collate_fn=lambda b: b)
    try:
        before = loader.stats()["store_requests"]
        seen = sum(len(b) for b in loader)
        requests = loader.stats()["store_requests"] - before
    finally:
        loader.close()
    assert seen == N_ITEMS
    # each shard goes to one worker: one GET per shard, but for the epoch's tail, where batches may cross
    assert requests <= _shard_count(packed) + 2 < N_ITEMS


def test_tar_shards_staged_from_a_bucket(s3, packed, tmp_path):
    name = os.path.basename(packed["pattern"])
    ds = coordl.TarShards(f"s3://{BUCKET}/shards/{name}", transform=_ident, storage_options=s3.storage_options(),
                          stage_dir=tmp_path / "stage")  # fmt: skip
    first = [ds[i] for i in range(len(ds))]
    n = ds.stats()["store_requests"]
    assert [ds[i] for i in range(len(ds))] == first and ds.stats()["store_requests"] == n
    assert ds.stats()["staged_items"] >= _shard_count(packed)


def test_lmdb_from_a_bucket_is_fetched_whole_into_stage_dir(s3, packed, tmp_path):
    local = coordl.LMDBDataset(os.path.join(packed["local"], "lmdb", "train.lmdb"), transform=_ident)
    with pytest.raises(ValueError, match="stage_dir"):
        coordl.LMDBDataset(f"s3://{BUCKET}/lmdb/train.lmdb", storage_options=s3.storage_options())
    ds = coordl.LMDBDataset(f"s3://{BUCKET}/lmdb/train.lmdb", transform=_ident, stage_dir=tmp_path / "stage",
                            storage_options=s3.storage_options())  # fmt: skip
    assert [ds[i] for i in range(len(ds))] == [local[i] for i in range(len(local))]
    assert ds.stats()["store_requests"] == 2  # one LIST, one GET of the whole data file

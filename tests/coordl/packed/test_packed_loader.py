"""LMDBDataset and TarShards through coordl.DataLoader with every tier: MinIO cache, sample cache,
coordinated prep, staging of shards (local and over a real NFS export), skipping bad records, dsanalyzer."""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import tarfile

import pytest
import torch

import coordl
import dsanalyzer
from coordl.coordinated.job import Group
from coordl.packed.lmdb import LMDBDataset
from coordl.packed.tar import TarShards
from coordl.prep.transforms import eval_transform, train_transform
from memcache import LocalStore
from tests.coordl.packed.conftest import N_ITEMS
from tests.support.ganesha import GaneshaServer, ganesha_missing_reason

KINDS = ["lmdb", "tar"]


def _open(kind: str, lmdb_path: str, tar_pattern: str, **kw):
    return LMDBDataset(lmdb_path, **kw) if kind == "lmdb" else TarShards(tar_pattern, **kw)


@pytest.mark.parametrize("kind", KINDS)
def test_workers_and_minio_cache_serve_epoch_two_from_memory(kind, image_root, lmdb_path, tar_pattern):
    ds = _open(kind, lmdb_path, tar_pattern, transform=eval_transform(32, resize=36))
    total = sum(len(ds.fetch(i)) for i in range(len(ds)))
    labels = []
    with coordl.DataLoader(ds, batch_size=5, num_workers=2, cache_bytes=2 * total) as loader:
        for _ in range(2):
            labels.append([int(y) for _x, ys in loader for y in ys])
        epochs = loader.epoch_stats()
    assert labels[0] == labels[1] == coordl.ImageFolder(image_root).targets  # shuffle off: the source order
    assert [e["hit_ratio"] for e in epochs] == [0.0, 1.0]
    assert [e["storage_items_read"] for e in epochs] == [N_ITEMS, 0]
    assert epochs[0]["storage_bytes_read"] == total


@pytest.mark.parametrize("kind", KINDS)
def test_sample_cache_holds_the_decoded_prefix(kind, lmdb_path, tar_pattern, tmp_path):
    store = LocalStore(16 << 20, name=f"packed{kind}", directory=tmp_path)
    ds = _open(kind, lmdb_path, tar_pattern, transform=train_transform(32, resize=40))
    with coordl.DataLoader(ds, batch_size=6, num_workers=2, sample_cache=store) as loader:
        labels = [[int(y) for _x, ys in loader for y in ys] for _ in range(2)]
        st = loader.stats()
    store.close()
    assert labels[0] == labels[1] == ds.targets  # prep_random finds the label without the record
    assert st["sample_cache_misses"] == N_ITEMS and st["sample_cache_hits"] == N_ITEMS
    assert st["storage_items_read"] == N_ITEMS  # epoch 2 read nothing from storage


def _coordinated_job(kind, lmdb_path, tar_pattern, shm_dir, out, tag, barrier):
    ds = _open(kind, lmdb_path, tar_pattern, transform=train_transform(32, resize=40))
    loader = coordl.DataLoader(ds, batch_size=4, shuffle=True, num_workers=1,
                               coordinate=Group(f"p{kind}", directory=shm_dir, timeout_s=60))  # fmt: skip
    barrier.wait(60)
    sums = [(round(float(x.sum()), 2), y.tolist()) for x, y in loader]
    loader.close()
    out.put((tag, sums))


@pytest.mark.parametrize("kind", KINDS)
def test_two_coordinated_jobs_receive_identical_batches(kind, lmdb_path, tar_pattern, tmp_path):
    ctx = mp.get_context("fork")
    q, barrier = ctx.Queue(), ctx.Barrier(2)
    args = (kind, lmdb_path, tar_pattern, str(tmp_path))
    procs = [ctx.Process(target=_coordinated_job, args=(*args, q, i, barrier)) for i in range(2)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(10)
        assert p.exitcode == 0
    assert results[0] == results[1] and len(results[0]) == N_ITEMS // 4


def _shard_files(tar_pattern: str) -> list[str]:
    d = os.path.dirname(tar_pattern)
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".tar"))


def test_stage_dir_stages_whole_shards_once(tar_pattern, tmp_path):
    shard_dir = os.path.dirname(tar_pattern)
    remote = sum(os.path.getsize(p) + os.path.getsize(p + ".idx") for p in _shard_files(tar_pattern))
    ds = TarShards(shard_dir, stage_dir=str(tmp_path / "stage"), transform=eval_transform(32, resize=36))
    with coordl.DataLoader(ds, batch_size=4, num_workers=2) as loader:
        for _ in loader:
            pass
        first = loader.stats()
        for _ in loader:
            pass
        second = loader.stats()
    n_shards = len(_shard_files(tar_pattern))
    assert first["staged_items"] == 2 * n_shards  # each shard and its index, as whole files
    assert first["remote_bytes_read"] == remote == second["remote_bytes_read"]  # epoch 2 read local copies
    assert [int(y) for _x, ys in coordl.DataLoader(ds, batch_size=4) for y in ys] == TarShards(
        shard_dir
    ).targets


def test_shards_over_nfs_are_staged_and_read_locally(tar_pattern, tmp_path):
    reason = ganesha_missing_reason()
    if reason:
        pytest.skip(reason)
    shard_dir = os.path.dirname(tar_pattern)
    local = TarShards(shard_dir)
    with GaneshaServer(shard_dir, tag="pktar") as server:
        last = len(local.shards) - 1
        url = server.url().replace("/export?", f"/export/data-{{000000..{last:06d}}}.tar?")
        ds = TarShards(url, stage_dir=str(tmp_path / "stage"))
        assert len(ds) == len(local) and ds.targets == local.targets
        assert [ds.fetch(i) for i in range(len(ds))] == [local.fetch(i) for i in range(len(local))]
        assert "nfs://" in ds.describe(0)
    # the server is gone: every shard was staged, reads go on from local disk
    assert [ds.fetch(i) for i in range(len(ds))][:3] == [local.fetch(i) for i in range(3)]


def test_skip_policy_drops_records_without_label_or_image(image_root, tmp_path):
    jpeg = coordl.ImageFolder(image_root).fetch(0)
    with tarfile.open(tmp_path / "s.tar", "w") as tf:
        for name, data in [("a.cls", b"0"), ("a.jpg", jpeg), ("b.jpg", jpeg),  # b: no label
                           ("c.cls", b"1"), ("c.jpg", b"garbage"), ("d.cls", b"2"), ("d.jpg", jpeg)]:  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    ds = TarShards(str(tmp_path / "s.tar"), transform=eval_transform(32, resize=36))
    with coordl.DataLoader(ds, batch_size=2, num_workers=1, on_error="skip") as loader:
        labels = [int(y) for _x, ys in loader for y in ys]
        assert labels == [0, 2] and loader.stats()["skipped_items"] == 2
    with (
        coordl.DataLoader(ds, batch_size=2, num_workers=1) as loader,
        pytest.raises(coordl.CorruptItemError, match=r"s\.tar:b\.jpg @ offset \d+"),
    ):
        list(loader)


@pytest.mark.parametrize("kind", KINDS)
def test_dsanalyzer_profiles_a_packed_source(kind, lmdb_path, tar_pattern):
    ds = _open(kind, lmdb_path, tar_pattern, transform=eval_transform(32, resize=36))

    def make_loader():
        return coordl.DataLoader(ds, batch_size=4, num_workers=1)

    report = dsanalyzer.profile(
        make_loader, lambda batch: torch.zeros(1), iters=3, warmup=1, workers_list=[1]
    )
    assert set(report["runs"]) == {"prep_scaling", "compute", "prep", "real"}
    assert report["bound"] in ("compute", "prep", "fetch")
    assert "fetch" not in vars(ds)  # the memory-served fetch was undone after the runs


@pytest.mark.parametrize("kind", KINDS)
def test_partitioned_cache_single_node(kind, lmdb_path, tar_pattern, monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        monkeypatch.delenv(k, raising=False)
    ds = _open(kind, lmdb_path, tar_pattern, transform=eval_transform(32, resize=36))
    with coordl.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, cache_bytes=4 << 20,
                           partitioned=True) as loader:  # fmt: skip
        labels = [sorted(int(y) for _x, ys in loader for y in ys) for _ in range(2)]
        epochs = loader.epoch_stats()
    assert labels[0] == labels[1] == sorted(ds.targets)
    assert [e["storage_items_read"] for e in epochs] == [N_ITEMS, 0]

"""The MinIO cache: exact hit counts, no eviction, no half-written reads, no bus error when shm is small."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import uuid

import pytest
import torch

import coordl
import coordl.fetch.minio as minio
from coordl.fetch.minio import MinioCache
from shmem.table import ROW_WORDS
from tests.coordl.ldr_sources import MemorySource


@pytest.fixture
def cache():
    c = MinioCache(1000, 20)
    yield c
    c.close()


def test_put_get_roundtrip_and_no_duplicates(cache: MinioCache) -> None:
    assert cache.get(3) is None and 3 not in cache
    assert cache.put(3, b"abc")
    assert bytes(cache.get(3)) == b"abc" and 3 in cache
    assert not cache.put(3, b"zzz")  # cached items are never replaced
    assert bytes(cache.get(3)) == b"abc"
    assert cache.stats() == {
        "cached_items": 1,
        "cached_bytes": 3,
        "capacity_bytes": 1000,
        "cache_backend": "shm",
    }
    with pytest.raises(IndexError, match="item 20"):
        cache.put(20, b"x")


def test_fills_until_budget_then_keeps_smaller_items(cache: MinioCache) -> None:
    assert cache.put(0, b"a" * 600)
    assert not cache.put(1, b"b" * 500)  # does not fit: refused, nothing evicted
    assert cache.put(2, b"c" * 400)
    assert not cache.put(4, b"d")
    assert bytes(cache.get(0)) == b"a" * 600 and cache.get(1) is None
    assert cache.stats()["cached_bytes"] == 1000


def test_half_written_item_is_never_served(cache: MinioCache) -> None:
    assert cache.put(5, b"hello")
    words = cache._table._row_words
    check = words[ROW_WORDS * 5 + 4]
    words[ROW_WORDS * 5 + 4] = 0  # as if the writer was killed mid-copy: claimed, never published
    assert cache.get(5) is None and 5 not in cache
    assert not cache.put(5, b"again")  # the slot stays taken; it is simply never served
    words[ROW_WORDS * 5 + 4] = check


def test_other_process_sees_items(cache: MinioCache) -> None:
    cache.put(1, b"from parent")
    code = (
        "import pickle,sys; c = pickle.loads(sys.stdin.buffer.read()); "
        "assert bytes(c.get(1)) == b'from parent'; assert c.put(2, b'from child'); c.close()"
    )
    subprocess.run([sys.executable, "-c", code], input=pickle.dumps(cache), check=True, timeout=60)
    assert bytes(cache.get(2)) == b"from child"
    assert cache.stats()["cached_items"] == 2
    assert all(os.path.exists(p) for p in cache.paths)  # the child did not unlink the owner's files


@pytest.mark.parametrize("num_workers", [0, 2])
def test_hit_ratio_equals_cached_fraction_every_epoch(num_workers: int) -> None:
    src = MemorySource(100, size=64)
    g = torch.Generator().manual_seed(0)
    with coordl.DataLoader(
        src, batch_size=10, shuffle=True, num_workers=num_workers, generator=g, cache_bytes=50 * 64
    ) as dl:
        first_epoch_order = [int(i) for b in dl for i in b[:, 0]]
        for _ in range(2):
            assert sum(len(b) for b in dl) == 100
        epochs = [(e["cache_hits"], e["cache_misses"], e["storage_items_read"]) for e in dl.epoch_stats()]
        s = dl.stats()
        cached = {i for i in range(100) if i in dl._chain.minio}
    assert epochs == [(0, 100, 100), (50, 50, 50), (50, 50, 50)]
    assert [e["hit_ratio"] for e in dl.epoch_stats()] == [0.0, 0.5, 0.5]
    assert s["cache_hits"] == 100 and s["cache_misses"] == 200
    assert s["cached_items"] == 50 and s["cached_bytes"] == 50 * 64
    assert s["storage_bytes_read"] == 200 * 64
    if num_workers == 0:  # one process fills in order: the first 50 fetched stay, forever
        assert cached == set(first_epoch_order[:50])
    else:
        assert len(cached) == 50


def test_whole_dataset_cached_means_no_storage_reads_after_epoch_one() -> None:
    with coordl.DataLoader(MemorySource(30), batch_size=8, num_workers=2, cache_bytes=1 << 20) as dl:
        for _ in range(3):
            list(dl)
        assert [e["storage_items_read"] for e in dl.epoch_stats()] == [30, 0, 0]
        dl.reset_stats()
        list(dl)
        assert dl.stats()["cache_hits"] == 30 and dl.stats()["cache_misses"] == 0


def test_cached_bytes_give_identical_samples() -> None:
    src = MemorySource(25)
    with coordl.DataLoader(src, batch_size=5, cache_bytes=1 << 16) as dl:
        assert [b.tolist() for b in dl] == [b.tolist() for b in dl]


def test_small_shm_warns_with_fix_and_falls_back_to_file(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(minio, "free_bytes", lambda d: 1000 if d == minio.DEFAULT_DIR else 1 << 40)
    monkeypatch.setattr(minio, "default_file_dir", lambda: str(tmp_path / "fallback"))
    with pytest.warns(RuntimeWarning, match=r"--shm-size=.*cache_dir="):
        dl = coordl.DataLoader(MemorySource(20), batch_size=5, cache_bytes=1 << 20)
    with dl:
        assert dl.stats()["cache_backend"] == "file"
        assert all(p.startswith(str(tmp_path / "fallback")) for p in dl._chain.minio.paths)
        list(dl)
        list(dl)
        assert dl.stats()["cache_hits"] == 20
    assert os.listdir(tmp_path / "fallback") == []


def test_cache_dir_option_is_used(tmp_path) -> None:
    with coordl.DataLoader(MemorySource(10), batch_size=5, cache_bytes=4096, cache_dir=str(tmp_path)) as dl:
        list(dl)
        assert dl.stats()["cache_backend"] == "file" and dl.stats()["cached_items"] == 10
        assert len(os.listdir(tmp_path)) == 1  # one segment: index and data


@pytest.fixture
def tiny_tmpfs(tmp_path):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / f"ldr-tmpfs-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_filesystem_stops_filling_without_bus_error(tiny_tmpfs) -> None:
    # Budget 4 MiB, file system 256 KiB: writes past the fs size must be refused, not SIGBUS.
    with pytest.warns(RuntimeWarning, match="less than cache_bytes"):
        dl = coordl.DataLoader(
            MemorySource(200, size=4096),
            batch_size=20,
            num_workers=2,
            cache_bytes=4 << 20,
            cache_dir=tiny_tmpfs,
        )
    with dl:
        for _ in range(2):
            assert sum(len(b) for b in dl) == 200
        s = dl.stats()
    assert 0 < s["cached_items"] < 64 and s["cached_bytes"] <= 256 * 1024
    assert dl.epoch_stats()[1]["cache_hits"] == s["cached_items"]


@pytest.mark.slow
def test_spawned_workers_share_the_cache() -> None:
    # spawn pickles the loader's dataset: the cache travels by path and workers attach to it.
    with coordl.DataLoader(
        MemorySource(40), batch_size=5, num_workers=2, multiprocessing_context="spawn", cache_bytes=20 * 64
    ) as dl:
        for _ in range(2):
            assert sum(len(b) for b in dl) == 40
        assert [(e["cache_hits"], e["cache_misses"]) for e in dl.epoch_stats()] == [(0, 40), (20, 20)]
        assert dl.stats()["cached_items"] == 20

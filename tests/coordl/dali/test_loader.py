"""DALILoader on DALI's CPU backend: batches, sampler semantics equal to coordl.DataLoader, stats."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("nvidia.dali", reason="coordl.dali needs NVIDIA DALI: pip install -e .[dali]")

import coordl  # noqa: E402
from coordl.dali import DALILoader, eval_pipeline, train_pipeline  # noqa: E402
from coordl.errors import CorruptItemError  # noqa: E402


def _labels_per_epoch(loader, epochs: int) -> list[list[list[int]]]:
    return [[labels.tolist() for _images, labels in loader] for _ in range(epochs)]


def _dali(root: str, **kw) -> DALILoader:
    kw.setdefault("transform", train_pipeline(32))
    kw.setdefault("seed", 7)
    return DALILoader(coordl.ImageFolder(root), **kw)


def test_batches_are_normalized_float_chw_with_int64_labels(jpeg_folder):
    with _dali(jpeg_folder, batch_size=8, shuffle=True) as loader:
        shapes = [(tuple(x.shape), x.dtype, y.dtype, tuple(y.shape)) for x, y in loader]
    assert shapes == [((8, 3, 32, 32), torch.float32, torch.int64, (8,))] * 5


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_label_batches_equal_coordl_dataloader(jpeg_folder, shuffle, drop_last):
    # batch_size 12 over 40 items: a partial last batch (kept or dropped); 3 epochs, one generator seed.
    kw = dict(batch_size=12, shuffle=shuffle, drop_last=drop_last)
    ref = coordl.DataLoader(coordl.ImageFolder(jpeg_folder), generator=torch.Generator().manual_seed(5), **kw)
    expected = _labels_per_epoch(ref, 3)
    with _dali(jpeg_folder, generator=torch.Generator().manual_seed(5), **kw) as loader:
        assert len(loader) == len(ref) == (3 if drop_last else 4)
        assert _labels_per_epoch(loader, 3) == expected
    ref.close()


def test_explicit_sampler_shards_like_coordl_dataloader(jpeg_folder):
    # Sharding under torchrun: a DistributedSampler per rank, the same shards as coordl.DataLoader.
    seen = []
    for rank in range(2):
        sampler = torch.utils.data.DistributedSampler(range(40), num_replicas=2, rank=rank, seed=3)
        ref = coordl.DataLoader(coordl.ImageFolder(jpeg_folder), batch_size=5, sampler=sampler)
        expected = _labels_per_epoch(ref, 1)
        ref.close()
        sampler = torch.utils.data.DistributedSampler(range(40), num_replicas=2, rank=rank, seed=3)
        with _dali(jpeg_folder, batch_size=5, sampler=sampler) as loader:
            got = _labels_per_epoch(loader, 1)
        assert got == expected
        seen.append(sum(len(b) for b in got[0]))
    assert seen == [20, 20]


def test_an_epoch_left_early_does_not_shift_the_next(jpeg_folder):
    kw = dict(batch_size=4, shuffle=True)
    ref = coordl.DataLoader(coordl.ImageFolder(jpeg_folder), generator=torch.Generator().manual_seed(9), **kw)
    with _dali(jpeg_folder, generator=torch.Generator().manual_seed(9), **kw) as loader:
        for pair in (ref, loader):
            for _batch in pair:
                break  # both loaders leave epoch 0 after one batch
        assert _labels_per_epoch(loader, 2) == _labels_per_epoch(ref, 2)
        epochs = loader.epoch_stats()
    assert [e["complete"] for e in epochs] == [False, True, True]
    ref.close()


def test_stats_have_coordl_dataloader_keys_and_count_the_cache(jpeg_folder):
    ref = coordl.DataLoader(coordl.ImageFolder(jpeg_folder), batch_size=8, cache_bytes=32 << 20)
    ref_keys = set(ref.stats())
    ref.close()
    with _dali(jpeg_folder, batch_size=8, shuffle=True, cache_bytes=32 << 20) as loader:
        _labels_per_epoch(loader, 2)
        stats, epochs = loader.stats(), loader.epoch_stats()
    assert ref_keys <= set(stats)
    assert stats["cached_items"] == 40 and stats["cache_backend"] != "none"
    assert [(e["cache_misses"], e["cache_hits"], e["storage_items_read"]) for e in epochs] == [
        (40, 0, 40),
        (0, 40, 0),
    ]
    assert [e["hit_ratio"] for e in epochs] == [0.0, 1.0]
    assert stats["items_loaded"] == 80 and stats["storage_bytes_read"] > 0


def test_stats_survive_close(jpeg_folder):
    loader = _dali(jpeg_folder, batch_size=10)
    _labels_per_epoch(loader, 1)
    loader.close()
    assert loader.stats()["items_loaded"] == 40
    with pytest.raises(RuntimeError, match="closed"):
        iter(loader)


def test_fetch_in_the_main_thread(jpeg_folder):
    ref = coordl.DataLoader(coordl.ImageFolder(jpeg_folder), batch_size=16)
    with _dali(jpeg_folder, batch_size=16, py_num_workers=0) as loader:
        assert _labels_per_epoch(loader, 2) == _labels_per_epoch(ref, 2)
    ref.close()


@pytest.mark.slow
def test_spawned_workers(jpeg_folder):
    ref = coordl.DataLoader(coordl.ImageFolder(jpeg_folder), batch_size=16)
    kw = dict(batch_size=16, py_start_method="spawn", cache_bytes=32 << 20)
    with _dali(jpeg_folder, **kw) as loader:
        assert _labels_per_epoch(loader, 2) == _labels_per_epoch(ref, 2)
        assert loader.stats()["cache_hits"] == 40  # the spawned worker reached the same MinIO cache
    ref.close()


def test_eval_pipeline_normalizes_with_imagenet_mean_std(gray_folder):
    # Uniform images of value v: every output pixel is (v/255 - mean_c) / std_c (JPEG error < 2 levels).
    with DALILoader(coordl.ImageFolder(gray_folder), batch_size=8, transform=eval_pipeline(16)) as loader:
        images, labels = next(iter(loader))
    values = np.array([40 + 50 * int(c) for c in labels])
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    expected = (values[:, None] / 255 - mean) / std  # N x 3
    got = images.mean(dim=(2, 3)).numpy()
    assert images.shape == (8, 3, 16, 16)
    np.testing.assert_allclose(got, expected, atol=2 / 255 / 0.224)


def test_a_corrupt_file_is_named(tmp_path, jpeg_folder):
    import shutil

    root = tmp_path / "ds"
    shutil.copytree(jpeg_folder, root)
    ds = coordl.ImageFolder(str(root))
    bad = ds.describe(5)
    with open(bad, "wb") as f:
        f.write(b"\xff\xd8 definitely not a jpeg")
    with (
        DALILoader(ds, batch_size=8, transform=train_pipeline(32)) as loader,
        pytest.raises(CorruptItemError) as info,
    ):
        _labels_per_epoch(loader, 1)
    assert info.value.path == bad and info.value.index == 5


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(batch_size=0), "batch_size"),
        (dict(batch_size=4, device="tpu"), "device"),
        (dict(batch_size=4, cache_bytes=-1), "cache_bytes"),
        (dict(batch_size=4, py_start_method="forkserver"), "py_start_method"),
        (dict(batch_size=4, prefetch_queue_depth=0), "prefetch_queue_depth"),
    ],
)
def test_bad_options_are_named(jpeg_folder, kwargs, match):
    with pytest.raises(ValueError, match=match):
        DALILoader(coordl.ImageFolder(jpeg_folder), **kwargs)


def test_gpu_without_cuda_says_so(jpeg_folder):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(RuntimeError, match="device='cpu'"):
        DALILoader(coordl.ImageFolder(jpeg_folder), batch_size=4, device="gpu")


def test_a_dataset_without_raw_bytes_is_refused():
    class Plain(torch.utils.data.Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return torch.zeros(3), 0

    with pytest.warns(UserWarning), pytest.raises(TypeError, match="raw encoded images"):
        DALILoader(Plain(), batch_size=2)


def test_labels_must_be_integers(jpeg_folder):
    ds = coordl.ImageFolder(jpeg_folder, target_transform=lambda t: f"class-{t}")
    with pytest.raises(TypeError, match="integer class labels"):
        DALILoader(ds, batch_size=4)


def test_close_stops_workers_and_frees_shared_memory(jpeg_folder):
    import glob
    import os
    import time

    import psutil

    def mine() -> set[str]:
        return {p for p in glob.glob("/dev/shm/coordl-*") if f"-{os.getpid()}-" in p}

    before, children = mine(), {c.pid for c in psutil.Process().children()}
    loader = _dali(jpeg_folder, batch_size=8, cache_bytes=32 << 20, py_num_workers=2)
    _labels_per_epoch(loader, 1)
    assert mine() - before  # the cache, counters and plan are segments of this process
    assert {c.pid for c in psutil.Process().children()} - children  # DALI's two workers
    loader.close()
    deadline = time.monotonic() + 10
    while {c.pid for c in psutil.Process().children()} - children and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not {c.pid for c in psutil.Process().children()} - children
    assert mine() == before


class _MemoryTier:
    """A fetch tier answering every item from a dict (what a profiler adds to serve reads from memory)."""

    name = "memory"
    in_memory = True

    def __init__(self, items: dict[int, bytes]) -> None:
        self.items = items

    def get(self, index: int) -> bytes:
        return self.items[index]

    def offer(self, index: int, raw: bytes) -> None:
        raise AssertionError("a tier that always hits is never offered bytes")

    def stats(self) -> dict[str, int]:
        return {}


def test_tiers_and_thread_count_changed_between_epochs_reach_dali(jpeg_folder):
    ds = coordl.ImageFolder(jpeg_folder)
    with _dali(jpeg_folder, batch_size=10) as loader:
        _labels_per_epoch(loader, 1)
        tier = _MemoryTier({i: ds.fetch(i) for i in range(len(ds))})
        loader.add_fetch_tier(tier)
        loader.num_workers = 1
        before = loader.stats()["storage_items_read"]
        expected = _labels_per_epoch(loader, 1)
        assert loader.stats()["storage_items_read"] == before  # DALI's restarted workers asked the tier
        assert loader.num_workers == 1
        loader.remove_fetch_tier(tier)
        assert _labels_per_epoch(loader, 1) == expected  # no shuffle: the same order after each restart
        assert loader.stats()["storage_items_read"] == before + 40


def test_partitioned_single_node_matches_coordl_dataloader(jpeg_folder):
    # One process (WORLD_SIZE unset): PartitionedSampler over all items, the MinIO cache as the local share.
    kw = dict(batch_size=8, shuffle=True, partitioned=True, cache_bytes=32 << 20)
    ref = coordl.DataLoader(coordl.ImageFolder(jpeg_folder), **kw)
    expected = _labels_per_epoch(ref, 2)
    ref.close()
    with _dali(jpeg_folder, **kw) as loader:
        assert _labels_per_epoch(loader, 2) == expected
        assert [e["hit_ratio"] for e in loader.epoch_stats()] == [0.0, 1.0]


def test_the_epoch_after_a_corrupt_file_is_error_free_once_fixed(tmp_path, jpeg_folder):
    import shutil

    root = tmp_path / "ds"
    shutil.copytree(jpeg_folder, root)
    ds = coordl.ImageFolder(str(root))
    path = Path(ds.describe(3))
    good = path.read_bytes()
    path.write_bytes(b"not an image at all")
    with DALILoader(ds, batch_size=8, transform=train_pipeline(32)) as loader:
        with pytest.raises(CorruptItemError):
            _labels_per_epoch(loader, 1)
        path.write_bytes(good)
        assert sum(len(b) for b in _labels_per_epoch(loader, 1)[0]) == 40  # DALI was restarted

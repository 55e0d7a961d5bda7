"""coordl.DataLoader + coordl.ImageFolder + a memcache store: epoch 2 is served from the cache, and
random augmentation still differs between epochs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import coordl
from coordl.synth import make_dataset
from coordl.transforms import train_transform
from memcache import KeySpace, LocalStore, RedisStore

N = 24


@pytest.fixture(scope="module")
def image_root(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("synth"), n=N, classes=3, width=64, height=48, workers=1)


def _epochs(loader, n_epochs: int = 2) -> list[dict[int, torch.Tensor]]:
    """Per epoch: image of every item (shuffle off, so batch position gives the index)."""
    out = []
    for _ in range(n_epochs):
        images = {}
        for b, (x, _y) in enumerate(loader):
            for j in range(x.shape[0]):
                images[b * loader.batch_size + j] = x[j]
        out.append(images)
    return out


def _check_epochs(loader) -> dict:
    loader.reset_stats()
    first, second = _epochs(loader)
    st = loader.stats()
    assert st["sample_cache_misses"] == N  # epoch 1: every item prepped and stored
    assert st["sample_cache_hits"] == N  # epoch 2: every item from the cache
    assert st["sample_cache_errors"] == 0
    assert st["storage_items_read"] == N  # epoch 2 read nothing from storage
    # Random crop + flip ran after the cache: the same item differs between epochs.
    differ = sum(not torch.equal(first[i], second[i]) for i in range(N))
    assert differ > N // 2
    return st


@pytest.mark.parametrize("num_workers", [0, 2])
def test_local_store_serves_epoch_two(image_root, tmp_path, num_workers):
    store = LocalStore(32 << 20, name=f"integ{num_workers}", directory=tmp_path)
    ds = coordl.ImageFolder(image_root, transform=train_transform(32, resize=40))
    with coordl.DataLoader(ds, batch_size=6, num_workers=num_workers, sample_cache=store) as loader:
        st = _check_epochs(loader)
    assert st["sample_cache_items"] == N
    # The cached array is the deterministic prefix's output (decode + resize), uint8 HWC.
    key = KeySpace(ds.dataset_identity(), ds.prep_identity()).key(0)
    arr = store.get_many([key])[key]
    assert arr.dtype == np.uint8 and min(arr.shape[:2]) == 40
    store.close()


@pytest.mark.redis
def test_redis_store_serves_epoch_two_and_survives_a_dead_node(image_root, redis_nodes):
    store = RedisStore([s.address for s in redis_nodes], retry_after_s=60)
    ds = coordl.ImageFolder(image_root, transform=train_transform(32, resize=40))
    with coordl.DataLoader(ds, batch_size=6, num_workers=2, sample_cache=store) as loader:
        _check_epochs(loader)
        redis_nodes[0].kill()  # between epochs: its third of the items falls back to fetch+prep
        loader.reset_stats()
        (third,) = _epochs(loader, 1)
        st = loader.stats()
        assert len(third) == N
        assert 0 < st["sample_cache_hits"] < N and st["sample_cache_errors"] >= 1
        assert st["storage_items_read"] == st["sample_cache_misses"]

"""coordl.DataLoader + coordl.ImageFolder + a memcache store: epoch 2 is served from the cache, and
random augmentation still differs between epochs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import coordl
from coordl.datasets.synth import make_dataset
from coordl.prep.transforms import train_transform
from memcache import KeySpace, LocalStore, RedisStore

N = 24


@pytest.fixture(autouse=True)
def _seeded():
    """Fixed augmentation draws: workers seed from the main process's torch RNG (base_seed + id)."""
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def image_root(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("synth"), n=N, classes=3, width=64, height=48, workers=1)


@pytest.fixture(scope="module")
def image_root_large(tmp_path_factory):
    # 16 batches of 6: at most prefetch_factor x workers = 4 batches are in flight when a node dies.
    return make_dataset(tmp_path_factory.mktemp("synth96"), n=96, classes=3, width=48, height=40, workers=1)


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
    # Random crop + flip ran after the cache: the same item differs between epochs. (A repeat needs
    # the same RandomResizedCrop box, drawn from continuous scale and ratio, and the same flip: far
    # rarer than 1 in 100 per item, so "more than half differ" holds by a huge margin; the fixed seed
    # above makes the draws themselves the same on every run.)
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
def test_redis_store_serves_epoch_two(image_root, redis_nodes):
    store = RedisStore([s.address for s in redis_nodes])
    ds = coordl.ImageFolder(image_root, transform=train_transform(32, resize=40))
    with coordl.DataLoader(ds, batch_size=6, num_workers=2, sample_cache=store) as loader:
        _check_epochs(loader)


@pytest.mark.redis
@pytest.mark.timeout(120)  # a node lost mid-epoch must not hang the epoch
def test_redis_node_killed_mid_epoch(image_root_large, redis_nodes):
    store = RedisStore([s.address for s in redis_nodes], retry_after_s=60)
    ds = coordl.ImageFolder(image_root_large, transform=train_transform(32, resize=40))
    n = len(ds)
    with coordl.DataLoader(ds, batch_size=6, num_workers=2, sample_cache=store) as loader:
        for _ in loader:  # epoch 1 fills the three nodes
            pass
        loader.reset_stats()
        seen = 0
        for b, (x, _y) in enumerate(loader):
            if b == 0:
                redis_nodes[0].kill()  # mid-epoch: its third of the items falls back to fetch+prep
            seen += x.shape[0]
        st = loader.stats()
        assert seen == n  # the epoch completed
        assert st["sample_cache_hits"] + st["sample_cache_misses"] == n
        assert st["sample_cache_misses"] > 0 and st["sample_cache_hits"] > n // 3
        assert st["sample_cache_errors"] >= 1
        assert st["storage_items_read"] == st["sample_cache_misses"]

"""Every tier on top of a bucket source: sample cache (memcache) and coordinated prep, as with local files."""

from __future__ import annotations

import multiprocessing as mp

import coordl
from coordl.coordinated.job import Group
from memcache import LocalStore
from tests.coordl.objectstore.conftest import N_ITEMS


def _transform():
    return coordl.transforms.train_transform(32, resize=40)


def test_sample_cache_over_a_bucket(s3, tmp_path):
    ds = coordl.ImageFolder("s3://data/train", transform=_transform(), storage_options=s3.storage_options())
    store = LocalStore(8 << 20, name="s3tiers", directory=tmp_path)
    try:
        with coordl.DataLoader(ds, batch_size=4, num_workers=2, sample_cache=store) as loader:
            n1 = sum(len(y) for _, y in loader)
            after1 = loader.stats()["store_requests"]
            n2 = sum(len(y) for _, y in loader)
            after2 = loader.stats()["store_requests"]
    finally:
        store.close()
    assert n1 == n2 == N_ITEMS
    assert after1 >= N_ITEMS and after2 == after1  # epoch 2: decoded samples from memcache, no GET


def _job(opts, shm_dir, out, tag, barrier):
    ds = coordl.ImageFolder("s3://data/train", transform=_transform(), storage_options=opts)
    loader = coordl.DataLoader(ds, batch_size=4, shuffle=True, num_workers=1,
                               coordinate=Group("s3", directory=shm_dir, timeout_s=60))  # fmt: skip
    barrier.wait(60)
    sums = [(round(float(x.sum()), 2), y.tolist()) for x, y in loader]
    requests = ds.stats()["store_requests"]
    loader.close()
    out.put((tag, sums, requests))


def test_coordinated_jobs_fetch_each_object_once(s3, tmp_path):
    coordl.ImageFolder(
        "s3://data/train", storage_options=s3.storage_options()
    )  # the listing, cached for both
    ctx = mp.get_context("fork")
    q, barrier = ctx.Queue(), ctx.Barrier(2)
    procs = [
        ctx.Process(target=_job, args=(s3.storage_options(), str(tmp_path), q, i, barrier)) for i in range(2)
    ]
    for p in procs:
        p.start()
    results = {tag: (sums, req) for tag, sums, req in (q.get(timeout=120) for _ in procs)}
    for p in procs:
        p.join(10)
        assert p.exitcode == 0
    assert results[0][0] == results[1][0] and len(results[0][0]) == N_ITEMS // 4  # the same batches
    # each object fetched once for both jobs (two independent loaders: 2 x 24), plus the group creator's probe
    # batch that sizes the shared slots (item 0, batch_size times); on a loaded machine a job that waits too
    # long for its peer's batch preps it itself (seen: 37 requests with other tests running), so the bound is
    # "fewer than two independent loaders", not the exact count
    total = results[0][1] + results[1][1]
    assert N_ITEMS <= total < 2 * N_ITEMS


def test_partitioned_cache_over_a_bucket(s3, image_root):
    """Two nodes (in one process, over loopback) sharing a bucket: the store is read in epoch 1 only."""
    from coordl.fetch.minio import MinioCache
    from coordl.partitioned.ownership import OwnerMap, PartitionedSampler
    from coordl.partitioned.redis_peer import PEER_COUNTERS, RedisPeerClient, key_prefix
    from coordl.partitioned.tier import PartitionedTier
    from memcache.server import start_redis
    from shmem.counters import SharedCounters

    ds = coordl.ImageFolder("s3://data/train", transform=lambda b: b, storage_options=s3.storage_options())
    local = coordl.ImageFolder(image_root, transform=lambda b: b)
    owners = OwnerMap(N_ITEMS, num_nodes=2, seed=3)
    caches = [MinioCache(4 << 20, N_ITEMS) for _ in range(2)]
    password = "bucket-partition-secret-0123456789"
    servers = [start_redis(16 << 20, password=password) for _ in range(2)]
    addrs = [(s.host, s.port) for s in servers]
    tiers = [
        PartitionedTier(owners, k, RedisPeerClient(addrs, password=password, prefix=key_prefix("b"), timeout_s=2),
                        SharedCounters(["cache_hits", "cache_misses"]), local_cache=caches[k],
                        peer_counters=SharedCounters(PEER_COUNTERS), mirror_local=True)
        for k in range(2)
    ]  # fmt: skip
    try:
        per_epoch = []
        for epoch in range(2):
            before = ds.stats()["store_requests"]
            for node in range(2):
                sampler = PartitionedSampler(N_ITEMS, 2, node, seed=5)
                sampler.set_epoch(epoch)
                for i in sampler:
                    raw = tiers[node].get(i)
                    if raw is None:  # what LoaderSource does: storage last, then offer to the tier
                        raw = ds.fetch(i)
                        tiers[node].offer(i, raw)
                    assert bytes(raw) == local.fetch(i)
            for t in tiers:
                t.flush()
            per_epoch.append(ds.stats()["store_requests"] - before)
    finally:
        for t in tiers:
            t.close()
        for s in servers:
            s.stop()
        for c in caches:
            c.close()
    assert per_epoch == [
        N_ITEMS,
        0,
    ]  # each object once (by its owner's first reader); epoch 2 all from caches

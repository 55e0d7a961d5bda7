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
    coordl.ImageFolder("s3://data/train", storage_options=s3.storage_options())  # the listing, cached for both
    ctx = mp.get_context("fork")
    q, barrier = ctx.Queue(), ctx.Barrier(2)
    procs = [ctx.Process(target=_job, args=(s3.storage_options(), str(tmp_path), q, i, barrier)) for i in range(2)]
    for p in procs:
        p.start()
    results = {tag: (sums, req) for tag, sums, req in (q.get(timeout=120) for _ in procs)}
    for p in procs:
        p.join(10)
        assert p.exitcode == 0
    assert results[0][0] == results[1][0] and len(results[0][0]) == N_ITEMS // 4  # the same batches
    # each object fetched once for both jobs (two independent loaders: 2 x 24), plus the group creator's probe
    # batch that sizes the shared slots (item 0, batch_size times)
    total = results[0][1] + results[1][1]
    assert N_ITEMS <= total <= N_ITEMS + 2 * 4 < 2 * N_ITEMS

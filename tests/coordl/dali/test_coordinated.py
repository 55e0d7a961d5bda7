"""DALILoader(coordinate=...): two real jobs fetch each batch's raw bytes once and both decode it."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest

pytest.importorskip("nvidia.dali", reason="coordl.dali needs NVIDIA DALI: pip install -e .[dali]")

import coordl  # noqa: E402
from coordl.coordinated.job import Group  # noqa: E402


def _job(root: str, shm_dir: str, out, tag: int, barrier) -> None:
    from coordl.dali import DALILoader, train_pipeline

    loader = DALILoader(coordl.ImageFolder(root), batch_size=8, shuffle=True, transform=train_pipeline(32),
                        coordinate=Group("dali-t", directory=shm_dir, timeout_s=60), seed=tag)  # fmt: skip
    barrier.wait(60)  # both jobs are members before either consumes
    labels = []
    for _ in range(2):
        assert len(loader) == 5
        for images, y in loader:
            assert tuple(images.shape) == (8, 3, 32, 32)
            labels.append(y.tolist())
    stats = loader.stats()
    loader.close()
    out.put((tag, labels, stats["storage_items_read"], stats["items_loaded"]))


@pytest.mark.slow
def test_two_jobs_share_the_raw_batches(jpeg_folder, tmp_path):
    # spawn: this pytest process may already run DALI threads, which a fork would copy half-held
    ctx = mp.get_context("spawn")
    q, barrier = ctx.Queue(), ctx.Barrier(2)
    procs = [ctx.Process(target=_job, args=(jpeg_folder, str(tmp_path), q, i, barrier)) for i in range(2)]
    for p in procs:
        p.start()
    results = {
        tag: (labels, storage, loaded) for tag, labels, storage, loaded in (q.get(timeout=180) for _ in procs)
    }
    for p in procs:
        p.join(20)
        assert p.exitcode == 0
    assert results[0][0] == results[1][0]  # the group's order, the same for both jobs
    assert len(results[0][0]) == 10
    # Each batch of the group was fetched once, by one job's producer or the other's (the counters are
    # each job's own): 2 epochs x 40 items, plus what producers fetched ahead into the group's next
    # epoch, at most one batch per ring slot (8 x 8). Two jobs fetching alone would read 160. Not always
    # whole batches: a producer may be part-way through one when its job closes (CI run 8: 141).
    for column in (1, 2):
        total = results[0][column] + results[1][column]
        assert 80 <= total <= 80 + 8 * 8
    assert not [f for f in os.listdir(tmp_path) if f.startswith("coordl-grp-")]


def test_coordinate_rejects_a_sampler(jpeg_folder, tmp_path):
    from coordl.dali import DALILoader

    with pytest.raises(ValueError, match="sampler"):
        DALILoader(coordl.ImageFolder(jpeg_folder), batch_size=4, sampler=list(range(8)),
                   coordinate=Group("dali-x", directory=str(tmp_path)))  # fmt: skip

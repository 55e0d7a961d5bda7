"""coordl.DataLoader(coordinate=...): two real jobs over a real ImageFolder share every batch."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest
import torch

import coordl
from coordl.coordinated.job import Group
from coordl.datasets.synth import make_dataset


def _job(root, shm_dir, out, tag, barrier):
    ds = coordl.ImageFolder(root, transform=coordl.transforms.train_transform(32, resize=40))
    loader = coordl.DataLoader(ds, batch_size=4, shuffle=True, num_workers=1,
                               coordinate=Group("t", directory=shm_dir, timeout_s=60))  # fmt: skip
    barrier.wait(60)  # both jobs are members before either consumes (late joins are tested elsewhere)
    sums = []
    for _ in range(2):
        assert len(loader) == 6
        for images, labels in loader:
            assert images.shape == (4, 3, 32, 32) and labels.dtype == torch.int64
            sums.append((round(float(images.sum()), 2), labels.tolist()))
    loader.close()
    out.put((tag, sums))


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory):
    return str(make_dataset(tmp_path_factory.mktemp("ds"), n=24, classes=3, width=64, height=48, seed=0))


def test_two_jobs_receive_identical_batches(tiny_dataset, tmp_path):
    ctx = mp.get_context("fork")
    q, barrier = ctx.Queue(), ctx.Barrier(2)
    procs = [ctx.Process(target=_job, args=(tiny_dataset, str(tmp_path), q, i, barrier)) for i in range(2)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(10)
        assert p.exitcode == 0
    assert results[0] == results[1]  # same augmented pixels: each batch was prepped once
    assert len(results[0]) == 12
    assert not [f for f in os.listdir(tmp_path) if f.startswith("coordl-grp-")]  # the group left nothing


def test_coordinate_rejects_a_sampler(tiny_dataset, tmp_path):
    ds = coordl.ImageFolder(tiny_dataset, transform=coordl.transforms.eval_transform(32, resize=36))
    with pytest.raises(ValueError, match="sampler"):
        coordl.DataLoader(
            ds, batch_size=4, sampler=list(range(8)), coordinate=Group("x", directory=str(tmp_path))
        )


def test_full_size_batches_after_a_multithreaded_probe(tiny_dataset, tmp_path):
    """Regression: the probe batch that sizes the ring runs a 224 px resize on torch's thread pool in the
    job; producers forked after it hung in their first parallel op (libgomp is not fork-safe). A
    subprocess with a bound, so a hang fails instead of blocking the suite."""
    import subprocess
    import sys

    script = (
        "import coordl, torch\n"
        "from coordl.coordinated.job import Group\n"
        "torch.set_num_threads(2)\n"
        f"ds = coordl.ImageFolder({str(tiny_dataset)!r}, transform=coordl.transforms.train_transform(224))\n"
        f"g = Group('probe', slots=2, timeout_s=60, directory={str(tmp_path)!r})\n"
        "with coordl.DataLoader(ds, batch_size=16, num_workers=2, coordinate=g) as dl:\n"
        "    x, y = next(iter(dl))\n"
        "print(tuple(x.shape))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(16, 3, 224, 224)"

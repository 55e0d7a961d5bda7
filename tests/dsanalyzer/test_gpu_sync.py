"""On a GPU the step's kernels run asynchronously: the timeline must synchronise at iteration
boundaries, or the step's GPU time shows up as wait for the next batch (a data stall that is not)."""

from __future__ import annotations

import time

import pytest
from torch.utils.data import DataLoader

import dsanalyzer
from tests.dsanalyzer.workloads import TimedSource


@pytest.mark.gpu
def test_async_gpu_step_counts_as_compute_not_as_wait():
    import torch

    x = torch.randn(4096, 4096, device="cuda")

    def step(batch: object) -> None:
        for _ in range(5):
            x @ x  # queued on the device; returns at once

    for _ in range(3):
        step(None)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        step(None)
    torch.cuda.synchronize()
    truth_s = (time.perf_counter() - t0) / 20

    def make_loader():
        return DataLoader(TimedSource(400, 100, 0.0, 0.0), batch_size=4, num_workers=0)

    report = dsanalyzer.profile(make_loader, step, iters=30, warmup=5, workers_list=[1])
    assert report["per_iter_s"]["compute"] == pytest.approx(truth_s, rel=0.1)
    assert report["runs"]["real"]["summary"]["wait_s"] < 0.2 * truth_s
    assert report["bound"] == "compute"

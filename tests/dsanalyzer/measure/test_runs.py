"""The loader-alone run's clock and CPU meter (:mod:`dsanalyzer.measure.runs`): what counts as steady."""

from __future__ import annotations

import multiprocessing as mp
import time

import torch

from dsanalyzer.measure.runs import JobCpu, loader_alone_rate


class EpochLoader:
    """``per_epoch`` batches ``step_s`` apart; an epoch's start takes ``start_s`` (inside ``iter()``) and
    its end ``stop_s`` (inside the ``next()`` that raises StopIteration, as torch's shutdown of workers)."""

    def __init__(
        self, per_epoch: int, step_s: float, start_s: float, stop_s: float, workers: int = 2
    ) -> None:
        self.per_epoch, self.step_s, self.start_s, self.stop_s = per_epoch, step_s, start_s, stop_s
        self.num_workers, self.batch_size = workers, 4

    def __iter__(self):
        time.sleep(self.start_s)
        return self._batches()

    def _batches(self):
        for _ in range(self.per_epoch):
            time.sleep(self.step_s)
            yield torch.zeros(self.batch_size)
        time.sleep(self.stop_s)


def test_epoch_starts_and_ends_are_left_out_of_the_steady_rate():
    loader = EpochLoader(per_epoch=4, step_s=0.01, start_s=0.3, stop_s=0.002)
    # 9 batches: warm-up 1, the epoch's 3 more, a start (2 batches of fill), 2 steady, and a start that
    # is still filling when the window closes: counted in, it read 4 x 5 / 0.37 s = 54 samples/s
    rate = loader_alone_rate(loader, lambda: iter(loader), iters=8, warmup=1, tick=lambda: None)
    assert 150 < rate < 420  # 4 samples every 10 ms (two 2 ms ends): 370/s less the loop and late sleeps


def test_a_cpu_meter_counts_a_worker_that_exited_between_readings():
    meter = JobCpu()
    before = meter.total()
    worker = mp.get_context("fork").Process(target=_spin, args=(0.4,))
    worker.start()
    worker.join()  # reaped: its CPU is the kernel's, no reading of it was ever taken
    used = meter.total() - before
    assert 0.35 < used < 1.0


def _spin(cpu_s: float) -> None:
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass

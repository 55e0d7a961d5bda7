"""What skew alone costs a loader that hands out whole batches: torch's dispatch replayed on measured sample times.

``bench_skew.py`` measures the loaders on a shared 2-core host, where other work on the cores moves every
figure. This replays torch's ``DataLoader`` dispatch (``torch/utils/data/dataloader.py``,
``_MultiProcessingDataLoaderIter._try_put_index`` and ``_next_data``) over per-sample prep times measured
in one process, with nothing else: no loader cost, no hand-off, a consumer that takes each batch the moment
it may, no other process on the cores. What is left between it and the work-conserving bound is what the
spread of sample times costs, at any number of workers:

- each worker has a FIFO queue of whole batches and preps them one after another;
- at most ``prefetch * workers`` batches are outstanding; each batch the consumer takes lets one more be
  put, and the first ``prefetch * workers`` are put at the start;
- ``in_order=True``: batches go to the workers round-robin and the consumer takes batch k only after k-1;
- ``in_order=False``: the consumer takes whichever batch is done first; a new batch goes to the next
  worker, round-robin, with fewer than ``prefetch`` batches queued;
- sample-level assembly (issue 61 item 4, not built): each worker takes the next sample when free and a
  batch is the next ``batch`` samples to finish, so the only loss is the last samples' tail.

The bound is ``workers / mean sample time``.
"""

from __future__ import annotations

import heapq

import numpy as np

from dsanalyzer.model.skew import handout_seconds

__all__ = ["batch_level", "sample_level", "replay"]


def batch_level(
    times: np.ndarray, workers: int, batch: int, prefetch: int = 2, in_order: bool = True
) -> float:
    """Seconds to hand out every batch of ``times`` (per-sample seconds, in sampler order) as torch does:
    dsanalyzer's replay (``dsanalyzer.model.skew.handout_seconds``, the one the profile's verdict uses)."""
    cost = [float(times[i : i + batch].sum()) for i in range(0, len(times), batch)]
    return handout_seconds(cost, workers, prefetch, in_order)


def sample_level(times: np.ndarray, workers: int) -> float:
    """Seconds until the last sample is done when each worker takes the next sample as soon as it is free."""
    free = [0.0] * workers
    for t in times:
        heapq.heapreplace(free, free[0] + float(t))
    return max(free)


def replay(
    cpu_s: list[float], workers: int, batch: int, samples: int = 1_281_167, seed: int = 0
) -> dict[str, float]:
    """Each dispatch's samples/s as a share of the bound over one epoch of ``samples`` drawn (with replacement)
    from the measured per-sample times: ImageNet's epoch by default, so that its first and last batches weigh
    as little as they do in a real epoch."""
    times = np.random.default_rng(seed).choice(np.asarray(cpu_s, np.float64), size=samples)
    bound_s = float(times.sum()) / workers
    return {
        "in_order": bound_s / batch_level(times, workers, batch, in_order=True),
        "any_order": bound_s / batch_level(times, workers, batch, in_order=False),
        "sample_level": bound_s / sample_level(times, workers),
    }

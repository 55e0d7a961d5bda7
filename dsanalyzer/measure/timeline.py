"""Per-iteration timeline of a training loop: time waiting for the next batch vs time in the step.

The loop is seen only through its loader's iterator: ``__next__`` starts (the step of the previous
batch has ended) and ``__next__`` returns (the wait for this batch has ended). So

    wait_s[i] = time inside __next__ for batch i
    step_s[i] = time from batch i handed over to the call for batch i+1

Each boundary also reads two CPU clocks: the calling thread's (``wait_cpu_s[i]``, the main thread's
own work inside ``__next__``: receiving, unpickling, collating; never its waiting, which costs no CPU)
and the whole process's (``step_cpu_s[i]``, the step's host-side work on every thread of the main
process, loader worker processes excluded). They are what the main process costs a core per batch,
apart from waiting for workers and from losing its core to them (:mod:`dsanalyzer.model.rates`).
Recording costs a few clock reads and list appends per iteration (a few microseconds), far below 1%
of any real step. On a GPU the step's kernels run asynchronously, so the boundary
synchronises the device first (``sync``); otherwise the GPU time would show up as wait.

Summaries drop warm-up iterations and report, for each quantity, the median over blocks of the
per-iteration mean (robust to a stray hiccup, yet right for bursty loaders whose waits are mostly
zero with an occasional long one: a plain median of waits would report 0) plus the p10/p90 spread
over single iterations.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Timeline", "RunSummary", "summarize", "summarize_cpu", "block_median", "cuda_sync_or_none"]


class Timeline:
    """Records wait and step durations at the iterator boundary of a training loop.

    Args:
        sync: called before each timestamp (device synchronisation); None on CPU.
    """

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.sync = sync
        self.wait_s: list[float] = []
        self.step_s: list[float] = []
        self.batch_items: list[int] = []
        self.wait_cpu_s: list[float] = []  # the calling (main) thread's CPU inside __next__
        self.step_cpu_s: list[float] = []  # the process's CPU (all threads) during the step
        self.t0: float | None = None  # the first __next__: the origin of ``starts`` (the trace's clock)
        self.starts: list[float] = []  # when each __next__ began, seconds since t0
        self.epoch_starts: list[int] = []  # indices of the batches that were an iterator's first (an epoch's)
        self._opened: float | None = None  # when the iterator whose first batch comes next was asked for
        self._last_end: float | None = None
        self._start: float | None = None
        self._cpu_start = (0.0, 0.0)  # (thread, process) CPU when __next__ began
        self._step_cpu_start: float | None = None

    def next_started(self) -> float:
        """Mark the start of ``__next__``: the previous step (if any) ends here."""
        if self.sync is not None:
            self.sync()
        now = time.perf_counter()
        proc = time.process_time()
        if self.t0 is None:
            self.t0 = now if self._opened is None else min(self._opened, now)
        if self._last_end is not None:
            self.step_s.append(now - self._last_end)
            if self._step_cpu_start is not None:
                self.step_cpu_s.append(proc - self._step_cpu_start)
            self._last_end = None
        self._start = now if self._opened is None else min(self._opened, now)
        self._cpu_start = (time.thread_time(), proc)
        return now

    def iterator_opened(self, at: float) -> None:
        """An epoch's iterator was asked for at ``at`` (``perf_counter``; before ``iter(loader)`` ran): its
        first batch is marked in ``epoch_starts`` and its wait runs from ``at``, so starting the epoch
        (torch spawns a new iterator's workers inside ``iter()``) counts as the loader's."""
        self._opened = at

    def next_ended(self, items: int) -> float:
        """Mark a batch of ``items`` samples handed to the loop: its wait ends here."""
        now = time.perf_counter()
        if self._start is not None and self.t0 is not None:  # (t0 is set with the first _start)
            self.wait_s.append(now - self._start)
            self.wait_cpu_s.append(time.thread_time() - self._cpu_start[0])
            self.starts.append(self._start - self.t0)
            self.batch_items.append(items)
            if self._opened is not None:
                self.epoch_starts.append(len(self.wait_s) - 1)
                self._opened = None
        self._last_end = now
        self._step_cpu_start = time.process_time()
        return now

    def abandon_pending(self) -> None:
        """Forget an unfinished wait (the iterator ended: StopIteration is not a batch)."""
        self._start = None
        self._last_end = None
        self._step_cpu_start = None

    @property
    def complete_iterations(self) -> int:
        """Iterations with both a wait and a step recorded."""
        return min(len(self.wait_s), len(self.step_s))


@dataclass
class RunSummary:
    """Per-iteration figures of one run after warm-up is dropped."""

    iters: int
    batch_size: float
    wait_s: float
    step_s: float
    iter_s: float
    samples_per_s: float
    spread_s: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "iters": self.iters,
            "batch_size": self.batch_size,
            "wait_s": self.wait_s,
            "step_s": self.step_s,
            "iter_s": self.iter_s,
            "samples_per_s": self.samples_per_s,
            "spread_s": self.spread_s,
        }


def block_median(values: list[float] | np.ndarray, blocks: int = 8) -> float:
    """Median over ``blocks`` contiguous blocks of the per-block mean (the mean when too few values)."""
    import numpy as np

    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return float("nan")
    n_blocks = max(1, min(blocks, arr.size // 4))
    parts = np.array_split(arr, n_blocks)
    return float(np.median([p.mean() for p in parts]))


def _spread(values: np.ndarray) -> dict:
    import numpy as np

    if values.size == 0:
        return {"p10": float("nan"), "p90": float("nan")}
    return {"p10": float(np.percentile(values, 10)), "p90": float(np.percentile(values, 90))}


def summarize(
    wait_s: list[float], step_s: list[float], batch_items: list[int], warmup: int = 5
) -> RunSummary:
    """Summarise a run: drop ``warmup`` iterations, then block medians of wait, step and their sum.

    Raises:
        ValueError: when no iteration is left after warm-up.
    """
    import numpy as np  # lazy: the import hook loads this module into every profiled process

    n = min(len(wait_s), len(step_s), len(batch_items))
    skip = min(warmup, max(0, n - 1))
    w = np.asarray(wait_s[skip:n], dtype=np.float64)
    s = np.asarray(step_s[skip:n], dtype=np.float64)
    b = np.asarray(batch_items[skip:n], dtype=np.float64)
    if w.size == 0:
        raise ValueError("no complete iteration was recorded (the loader yielded no batches)")
    total = w + s
    iter_s = block_median(total)
    batch = float(np.median(b))
    # Throughput uses the plain totals: samples handed over divided by the time it took.
    samples_per_s = float(b.sum() / total.sum()) if total.sum() > 0 else float("inf")
    return RunSummary(
        iters=int(w.size),
        batch_size=batch,
        wait_s=block_median(w),
        step_s=block_median(s),
        iter_s=iter_s,
        samples_per_s=samples_per_s,
        spread_s={"wait": _spread(w), "step": _spread(s), "iter": _spread(total)},
    )


def summarize_cpu(wait_cpu_s: list[float], step_cpu_s: list[float], warmup: int = 5) -> dict | None:
    """The main process's own CPU seconds per batch, warm-up dropped (block medians): None when not recorded.

    ``receive_s``: the main thread inside ``__next__`` (its share of the data path); ``step_s``: the
    whole process during the step (its host-side work, intra-op threads included).
    """
    n = min(len(wait_cpu_s), len(step_cpu_s))
    if n == 0:
        return None
    skip = min(warmup, max(0, n - 1))
    receive, step = block_median(wait_cpu_s[skip:n]), block_median(step_cpu_s[skip:n])
    return {"receive_s": receive, "step_s": step, "iters": n - skip}


def cuda_sync_or_none() -> Callable[[], None] | None:
    """``torch.cuda.synchronize`` when a CUDA device is in use by this process, else None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None

    def sync() -> None:
        # Only synchronise once the script has touched the device: initialising CUDA here would
        # cost seconds and memory the script never asked for.
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()

    return sync

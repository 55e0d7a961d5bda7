"""torch's intra-op threads in the profiled process: how many, whether they follow the cores, where the step runs.

The what-if gives a job more cores. With a CPU step, torch's intra-op threads in the main process
follow the cores by default (``torch.get_num_threads()`` is the size of the affinity mask: 1 under
``taskset -c 0``, 2 under ``taskset -c 0,1``), and between parallel regions OpenMP's idle threads
spin before they sleep: beside loader workers that keep every core busy, each spinning thread holds
a share of the cores the workers wanted (:mod:`dsanalyzer.model.cores`). A profile on one CPU runs
one thread and cannot see that, so it records what decides it: the thread count, whether the script
(or ``OMP_NUM_THREADS``/``MKL_NUM_THREADS``) fixed it, and whether the step runs on a GPU (then the
step has no CPU parallel regions and the threads stay asleep).

:func:`watch` wraps ``torch.set_num_threads`` when the import hook sees ``import torch`` complete
(the script has not run a line after it), so a script that fixes its thread count is told apart from one
that keeps torch's default even on one CPU, where both read 1.
"""

from __future__ import annotations

import os
import sys
from functools import wraps
from typing import Any

__all__ = ["watch", "facts"]

_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
_CALLED: dict[str, int] = {}  # pid -> the count the script asked for (a forked worker's own call is its own)


def watch(torch_module: Any) -> None:
    """Record calls to ``torch.set_num_threads`` from now on (idempotent)."""
    original = getattr(torch_module, "set_num_threads", None)
    if original is None or getattr(original, "_dsanalyzer_watched", False):
        return

    @wraps(original)
    def set_num_threads(n: int) -> None:
        _CALLED[str(os.getpid())] = int(n)
        return original(n)

    set_num_threads._dsanalyzer_watched = True  # type: ignore[attr-defined]
    torch_module.set_num_threads = set_num_threads


def facts() -> dict:
    """``torch_threads``, ``threads_follow_cores`` and ``step_device`` of this (the main) process; {} without torch."""
    torch = sys.modules.get("torch")
    get = getattr(torch, "get_num_threads", None)
    if not callable(get):
        return {}
    threads = int(get())
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    fixed = str(os.getpid()) in _CALLED or any(os.environ.get(k) for k in _ENV)
    cuda = getattr(torch, "cuda", None)
    on_gpu = bool(
        cuda is not None and cuda.is_initialized()
    )  # a script that never touched the GPU: a CPU step
    return {
        "torch_threads": threads,
        "threads_follow_cores": not fixed and threads == cores,
        "threads_fixed_by": "torch.set_num_threads"
        if str(os.getpid()) in _CALLED
        else next((k for k in _ENV if os.environ.get(k)), None),  # fmt: skip
        "step_device": "cuda" if on_gpu else "cpu",
    }

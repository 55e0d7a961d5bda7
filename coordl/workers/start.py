"""Starting torch's loader workers: whether they are forked, forking them with a frozen heap, showing
them the user's dataset as ``get_worker_info().dataset``, and making sure each forked worker got past
the fork (:mod:`coordl.workers.stuck`)."""

from __future__ import annotations

import atexit
import gc
import mmap
import multiprocessing
import os
import struct
import sys
from typing import Any

# torch's worker loop imports both at every worker's start (to seed NumPy, and to seed datapipes):
# imported here, once, forked workers inherit them instead of each paying ~10 ms of CPU per epoch
# (measured: numpy.random's import was half of a fresh worker's start on the 2-core VM).
import numpy.random  # noqa: F401
import torch.utils.data
import torch.utils.data.graph_settings  # noqa: F401

from coordl.fetch.pipeline import LoaderSource
from coordl.resume.workers import ResumableStream
from coordl.workers.stuck import KEEP_ARGS, StartWatch
from shmem.flag import SharedFlag

__all__ = ["ShowUserDataset", "forks_workers", "start_workers"]


def start_workers(torch_loader: torch.utils.data.DataLoader) -> Any:
    """``iter(torch_loader)`` (which starts its workers), with the collector's objects frozen meanwhile,
    and, for forked workers, a worker stuck inside the fork replaced (:mod:`coordl.workers.stuck`).

    A forked worker shares the main process's heap copy-on-write. Its first full collection writes to
    the header of every object it inherited, so the worker copies all those pages (measured: ~20 page
    faults per sample on 960-item epochs with fresh workers each epoch). Objects frozen at the fork
    are never collected in the worker; the main process unfreezes them at once (Python's documented
    pre-fork recipe, ``gc.freeze``). Left alone when the program froze objects itself.
    """
    if torch_loader.num_workers == 0:
        return iter(torch_loader)
    user_init, user_context = torch_loader.worker_init_fn, torch_loader.multiprocessing_context
    forked = forks_workers(torch_loader)
    show = ShowUserDataset(user_init, torch_loader.num_workers if forked else 0)
    torch_loader.worker_init_fn = show
    if forked and (user_context is None or type(user_context) is multiprocessing.context.ForkContext):
        torch_loader.multiprocessing_context = KEEP_ARGS  # the same fork; a stuck worker can be replaced
    else:  # the same start method, with a done event no killed worker can leave locked (shmem.flag)
        context = user_context if user_context is not None else multiprocessing.get_context()
        flagged = _FLAGGED.get(type(context))
        if flagged is not None:
            torch_loader.multiprocessing_context = flagged
    running = {w.pid for w in getattr(getattr(torch_loader, "_iterator", None), "_workers", None) or ()}
    try:
        with _frozen(forked):
            it = iter(torch_loader)
        if forked:  # a worker stuck inside the fork is replaced (coordl.workers.stuck)
            StartWatch(it, show.started_pid, running)
        return it
    finally:
        torch_loader.worker_init_fn, torch_loader.multiprocessing_context = user_init, user_context


class _SpawnedWorker(multiprocessing.context.SpawnProcess):
    """A spawned worker that ends as a forked one does: its exit handlers run, then ``os._exit``.

    A spawned child ends with ``sys.exit``, so the interpreter finalizes, and a daemon thread that asks for
    the GIL after that point is ended with ``pthread_exit``. torch's worker leaves one such thread behind
    at every shutdown: its data queue's feeder (torch cancels its join), which may be sharing a batch's
    tensors in torch's C++ code right then. Unwinding out of that code aborts the process ("terminate
    called without an active exception", then torch's "killed by signal: Aborted" in the main process;
    tests/coordl/workers/test_worker_exit.py). A forked or forkserver child never finalizes (multiprocessing
    ends it with ``os._exit``): this one now ends the same way, after the ``atexit`` handlers that the
    worker's own objects registered (shared segments, caches), which a finalizing interpreter would run.
    """

    def _bootstrap(self, *args: Any, **kwargs: Any) -> int:
        code: int = super()._bootstrap(*args, **kwargs)  # type: ignore[misc]  # (not in typeshed) run(), then multiprocessing's own exit steps
        try:
            atexit._run_exitfuncs()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (AttributeError, OSError, ValueError):
                    pass
            os._exit(code)


# SharedFlag has Event's methods (set, is_set, clear, wait) without being one: what torch calls.
class _SpawnContext(multiprocessing.context.SpawnContext):
    Process = _SpawnedWorker

    def Event(self) -> SharedFlag:  # type: ignore[override]  # noqa: N802 - multiprocessing's name
        return SharedFlag(self)


class _ForkServerContext(multiprocessing.context.ForkServerContext):
    def Event(self) -> SharedFlag:  # type: ignore[override]  # noqa: N802 - multiprocessing's name
        return SharedFlag(self)


# torch's ``_workers_done_event`` is ``multiprocessing_context.Event()``: these give a lock-free one.
_FLAGGED = {
    multiprocessing.context.SpawnContext: _SpawnContext(),
    multiprocessing.context.ForkServerContext: _ForkServerContext(),
}


class _frozen:
    """``gc.freeze()`` around the fork (see :func:`start_workers`), unless the program froze objects itself."""

    def __init__(self, forked: bool) -> None:
        self.active = forked and not gc.get_freeze_count()

    def __enter__(self) -> None:
        if self.active:
            gc.freeze()

    def __exit__(self, *exc: object) -> None:
        if self.active:
            gc.unfreeze()


class ShowUserDataset:
    """A worker's first step: it reports that it started, then ``get_worker_info().dataset`` becomes the
    user's dataset, then the user's ``worker_init_fn`` runs.

    torch sets it to the dataset its loader iterates, which for coordl is the fetch pipeline
    (:class:`coordl.fetch.pipeline.LoaderSource`), or for an ``IterableDataset`` the resumable stream
    around it (:class:`coordl.resume.workers.ResumableStream`). Code written for torch reads and configures the
    dataset there (``get_worker_info().dataset.open_files()``, ``isinstance`` checks): it gets the
    worker's copy of the user's dataset, the one its items are read from.

    Args:
        init_fn: the user's ``worker_init_fn``.
        forked_workers: for forked workers, their number: each writes its pid into a slot of an anonymous
            shared mapping (inherited at the fork) before anything else; 0 for spawned workers.
    """

    def __init__(self, init_fn: Any, forked_workers: int = 0) -> None:
        self.init_fn = init_fn
        self.started = mmap.mmap(-1, 8 * forked_workers) if forked_workers else None

    def __getstate__(self) -> dict[str, Any]:
        return {"init_fn": self.init_fn, "started": None}  # pickled for spawned workers: no mapping

    def started_pid(self, worker_id: int) -> int:
        """The pid the worker ``worker_id`` reported (0: none yet)."""
        return struct.unpack_from("q", self.started, 8 * worker_id)[0] if self.started is not None else 0

    def __call__(self, worker_id: int) -> None:
        if self.started is not None and worker_id < len(self.started) // 8:
            struct.pack_into("q", self.started, 8 * worker_id, os.getpid())
        info = torch.utils.data.get_worker_info()
        dataset = getattr(info, "dataset", None)
        user = (
            dataset.user_dataset if isinstance(dataset, LoaderSource)
            else dataset.dataset if isinstance(dataset, ResumableStream)  # an IterableDataset, kept resumable
            else dataset
        )  # fmt: skip
        if user is not dataset:
            # WorkerInfo refuses assignment once built; this is the value torch would have given it.
            object.__setattr__(info, "dataset", user)
        if self.init_fn is not None:
            self.init_fn(worker_id)


def forks_workers(torch_loader: torch.utils.data.DataLoader) -> bool:
    """Whether the workers are forked (they inherit the main process's open segments), not spawned."""
    ctx = torch_loader.multiprocessing_context or multiprocessing.get_context()
    return ctx.get_start_method() == "fork"

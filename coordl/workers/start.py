"""Starting torch's loader workers: whether they are forked, forking them with a frozen heap, and showing
them the user's dataset as ``get_worker_info().dataset``."""

from __future__ import annotations

import gc
import multiprocessing
from typing import Any

# torch's worker loop imports both at every worker's start (to seed NumPy, and to seed datapipes):
# imported here, once, forked workers inherit them instead of each paying ~10 ms of CPU per epoch
# (measured: numpy.random's import was half of a fresh worker's start on the 2-core VM).
import numpy.random  # noqa: F401
import torch.utils.data
import torch.utils.data.graph_settings  # noqa: F401

from coordl.fetch.pipeline import LoaderSource
from coordl.resume.workers import ResumableStream

__all__ = ["ShowUserDataset", "forks_workers", "start_workers"]


def start_workers(torch_loader: torch.utils.data.DataLoader) -> Any:
    """``iter(torch_loader)`` (which starts its workers), with the collector's objects frozen meanwhile.

    A forked worker shares the main process's heap copy-on-write. Its first full collection writes to
    the header of every object it inherited, so the worker copies all those pages (measured: ~20 page
    faults per sample on 960-item epochs with fresh workers each epoch). Objects frozen at the fork
    are never collected in the worker; the main process unfreezes them at once (Python's documented
    pre-fork recipe, ``gc.freeze``). Left alone when the program froze objects itself.
    """
    if torch_loader.num_workers == 0:
        return iter(torch_loader)
    user_init = torch_loader.worker_init_fn
    torch_loader.worker_init_fn = ShowUserDataset(user_init)
    try:
        if not forks_workers(torch_loader) or gc.get_freeze_count():
            return iter(torch_loader)
        gc.freeze()
        try:
            return iter(torch_loader)
        finally:
            gc.unfreeze()
    finally:
        torch_loader.worker_init_fn = user_init


class ShowUserDataset:
    """A worker's first step: ``get_worker_info().dataset`` becomes the user's dataset, then the user's
    ``worker_init_fn`` runs.

    torch sets it to the dataset its loader iterates, which for coordl is the fetch pipeline
    (:class:`coordl.fetch.pipeline.LoaderSource`), or for an ``IterableDataset`` the resumable stream
    around it (:class:`coordl.resume.workers.ResumableStream`). Code written for torch reads and configures the
    dataset there (``get_worker_info().dataset.open_files()``, ``isinstance`` checks): it gets the
    worker's copy of the user's dataset, the one its items are read from.
    """

    def __init__(self, init_fn: Any) -> None:
        self.init_fn = init_fn

    def __call__(self, worker_id: int) -> None:
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

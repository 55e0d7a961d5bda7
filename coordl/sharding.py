"""Never silently wrong under DDP: a loader that every rank iterates in full says so, once.

A ``coordl.DataLoader`` (like torch's) reads the whole dataset on every rank unless something shards
it: a ``DistributedSampler`` (Lightning injects one; so does ``torchrun`` code that passes one),
Accelerate's ``prepare`` (which iterates a loader of its own, so coordl's ``__iter__`` never runs), or
``partitioned=True``. Without any of them, a job on N ranks trains every sample N times per epoch:
wrong epochs, wrong learning-rate schedules, and nothing fails. :func:`unsharded_warning` finds that
case when an epoch starts: a process group of world size > 1 and the loader ordering its epochs with
the sampler torch made by default (the user passed neither ``sampler`` nor ``batch_sampler``). A sampler
the user chose is taken as meant: to read everything on every rank on purpose, pass one explicitly.
"""

from __future__ import annotations

from typing import Any

__all__ = ["unsharded_warning"]


def unsharded_warning(
    *, user_sampler: Any, user_batch_sampler: Any, partitioned: bool, iterable: bool
) -> str | None:
    """The warning text when this rank iterates the whole dataset of a distributed job, else None."""
    if user_sampler is not None or user_batch_sampler is not None or partitioned or iterable:
        return None
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
        return None
    world, rank = dist.get_world_size(), dist.get_rank()
    return (
        f"coordl.DataLoader is iterated by rank {rank} of a process group of {world} with no distributed "
        f"sampler: every rank reads the whole dataset each epoch ({world}x the samples of one epoch). Fix: "
        "pass sampler=torch.utils.data.DistributedSampler(dataset) (and call loader.sampler.set_epoch(epoch) "
        "each epoch), or partitioned=True, or let the framework shard it (Lightning: Trainer(strategy='ddp') "
        "with use_distributed_sampler left on; Accelerate: loader = accelerator.prepare(loader)). To read "
        "everything on every rank on purpose, pass the sampler explicitly (e.g. SequentialSampler(dataset)). "
        "See docs/frameworks.md."
    )

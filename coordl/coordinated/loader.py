"""``coordl.DataLoader(..., coordinate=...)``: join the named group with the loader's own pipeline."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from typing import Any

from coordl.coordinated.job import Group, GroupMember
from coordl.coordinated.producer import BatchMaker

__all__ = ["join_for_loader"]


def join_for_loader(
    coordinate: str | Group,
    *,
    dataset: Any,
    collate_fn: Callable[[list[Any]], Any],
    batch_size: int | None,
    shuffle: bool | None,
    drop_last: bool,
    sampler: Any,
    batch_sampler: Any,
    num_workers: int,
    mp_context: Any,
) -> GroupMember:
    """Join the group that ``coordl.DataLoader(..., coordinate=...)`` names, with the loader's pipeline."""
    group = coordinate if isinstance(coordinate, Group) else Group(str(coordinate))
    if sampler is not None or batch_sampler is not None:
        raise ValueError(
            "coordinate= decides the batch order for the whole group (from Group(seed=...)); "
            "it cannot be combined with sampler= or batch_sampler="
        )
    if not batch_size:
        raise ValueError("coordinate= needs batch_size >= 1")
    if isinstance(mp_context, str):
        mp_context = mp.get_context(mp_context)
    return GroupMember(
        group,
        num_items=len(dataset),
        batch_size=batch_size,
        drop_last=drop_last,
        shuffle=bool(shuffle),
        make_batch=BatchMaker(dataset, collate_fn),
        num_producers=num_workers,
        mp_context=mp_context,
    )

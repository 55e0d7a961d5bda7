"""Coordinated fetch for ``DALILoader(coordinate=...)``: jobs on one server share each batch's raw bytes.

``coordl.DataLoader(coordinate=...)`` shares *prepped* batches between the jobs of a group (see
:mod:`coordl.coordinated.job`). A DALI job preps on its own GPU, and a decoded batch in one GPU's
memory cannot be handed to another process's GPU for less than the decode costs, so here the unit
shared is the batch's **raw bytes plus labels**: the group's producer processes fetch each batch once
(through the job's fetch chain: MinIO, partitioned peers, storage) and write it into the group's
shared ring; every job reads every batch in the group's order and decodes/augments it in its own
DALI pipeline (nvJPEG on its GPU, or its CPU threads with ``device="cpu"``). Storage and cache reads
are done once for all jobs; decode runs once per job, which is what each job's own random
augmentation needs anyway.

The batch order is the group's (``Group(seed=...)``), as with ``coordl.DataLoader``; ``sampler=`` and
``shuffle``'s generator do not apply.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from coordl.coordinated.job import Group, GroupMember
from coordl.coordinated.loader import join_for_loader
from coordl.fetch.pipeline import LoaderSource

__all__ = ["RawItems", "collate_raw", "CoordinatedFeed", "join_raw_group"]

# Raw batches vary in size (JPEG sizes vary); the group's slots are sized for the largest items.
_SLOT_MARGIN = 1.10
_PROBE_ITEMS = 256


class RawItems(torch.utils.data.Dataset):
    """``indices -> [(raw bytes, label)]`` through the loader's fetch chain (run by the producers)."""

    def __init__(self, reader: LoaderSource, labels: np.ndarray) -> None:
        self.reader = reader
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: list[int]) -> list[tuple[np.ndarray, int]]:
        raws = self.reader.fetch_many([int(i) for i in indices])
        out = [
            (np.frombuffer(raw, dtype=np.uint8), int(self.labels[i]))
            for raw, i in zip(raws, indices, strict=True)
        ]
        self.reader.counters.add("items_loaded", len(out))
        return out


def collate_raw(samples: list[tuple[np.ndarray, int]]) -> dict[str, torch.Tensor]:
    """One tensor of concatenated bytes, their end offsets and the labels: what the group's ring holds."""
    sizes = np.fromiter((len(raw) for raw, _ in samples), dtype=np.int64, count=len(samples))
    data = np.concatenate([raw for raw, _ in samples]) if samples else np.empty(0, np.uint8)
    return {
        "data": torch.from_numpy(data),
        "ends": torch.from_numpy(np.cumsum(sizes)),
        "labels": torch.tensor([label for _, label in samples], dtype=torch.int64),
    }


def _max_item_bytes(reader: LoaderSource) -> int:
    """The largest item's size: from the file sizes when items are local files, else a sample x 2."""
    source, n = reader.source, len(reader.source)
    describe = getattr(source, "describe", None)
    if callable(describe) and os.path.isfile(str(describe(0))):
        try:
            return max(os.stat(describe(i)).st_size for i in range(n))
        except (OSError, TypeError, ValueError):
            pass  # not local paths: estimate from a sample
    step = max(1, n // _PROBE_ITEMS)
    return 2 * max(len(source.fetch(i)) for i in range(0, n, step))


def join_raw_group(
    coordinate: str | Group,
    *,
    reader: LoaderSource,
    labels: np.ndarray,
    batch_size: int,
    shuffle: bool | None,
    drop_last: bool,
    sampler: Any,
    producers: int,
    mp_context: Any,
) -> GroupMember:
    """Join group ``coordinate`` sharing raw batches; slots sized for the largest items unless set."""
    group = coordinate if isinstance(coordinate, Group) else Group(str(coordinate))
    if group.slot_bytes is None:
        per_batch = batch_size * (_max_item_bytes(reader) + 8 + 8) + (1 << 16)
        group = dataclasses.replace(group, slot_bytes=int(per_batch * _SLOT_MARGIN))
    return join_for_loader(
        group, dataset=RawItems(reader, labels), collate_fn=collate_raw, batch_size=batch_size,
        shuffle=shuffle, drop_last=drop_last, sampler=sampler, batch_sampler=None,
        num_workers=producers, mp_context=mp_context,
    )  # fmt: skip


class CoordinatedFeed:
    """DALI's external-source callback in coordinated mode: the group's next raw batch, per sample.

    Runs in the job's main process (``parallel=False``): the batch is already fetched and sits in the
    group's shared ring, so this is a copy out of the ring, not a read.
    """

    def __init__(self) -> None:
        self._batches: Iterator[Any] | None = None

    def start(self, batches: Iterator[Any]) -> None:
        """Feed ``batches`` (the group member's epoch) from the next pipeline run on."""
        self._batches = batches

    def stop(self) -> None:
        """End the current epoch early (the member's epoch generator advances this job's cursor)."""
        if self._batches is not None:
            close = getattr(self._batches, "close", None)
            if callable(close):
                close()
        self._batches = iter(())

    def __call__(self, info: Any = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
        if self._batches is None:
            raise StopIteration
        batch = next(self._batches)  # StopIteration ends DALI's epoch too
        data = batch["data"].numpy()
        ends = batch["ends"].numpy()
        labels = batch["labels"].numpy()
        starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
        # Copies: the ring slot is reused once this job's cursor moves past it.
        images = [data[s:e].copy() for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]
        return images, [labels[k : k + 1].copy() for k in range(len(labels))]

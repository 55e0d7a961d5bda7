"""Raw bytes into DALI: the epoch's batch plan in shared memory, and the external-source callback.

A ``DALILoader`` decides each epoch's batches in its own process (torch's sampler machinery, so the
order equals ``coordl.DataLoader``'s) and writes them into an :class:`EpochPlan`, a small shared
segment. DALI's parallel ``external_source`` runs :class:`BatchFeed` in its Python worker processes
(forked or spawned when the pipeline is built): for ``BatchInfo(iteration, epoch_idx)`` the feed
reads batch ``iteration`` from the plan, fetches every item's raw bytes through the loader's fetch
chain (MinIO cache, partitioned peers, then storage, the same :class:`LoaderSource` path as
``coordl.DataLoader``; storage misses read in parallel threads) and hands DALI the encoded bytes and
the labels. Decoding and augmentation then run in DALI, on the CPU or the GPU.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from coordl.errors import CoordlError
from coordl.fetch.pipeline import LoaderSource
from shmem.segment import Segment

__all__ = ["EpochPlan", "BatchFeed", "item_labels"]

# Plan header fields (int64): the DALI epoch the plan is for (-1 while one is written), its number of
# batches (lowered to stop an epoch early), the number of indices written, and the epoch being written.
_H_EPOCH, _H_BATCHES, _H_ITEMS, _H_WRITING, _HEADER = 0, 1, 2, 3, 4


class EpochPlan:
    """One epoch's batches (lists of item indices), shared with DALI's worker processes.

    Args:
        max_batches: the most batches an epoch may have (the loader's ``len``).
        max_items: the most indices an epoch may hold (``max_batches * batch_size``).
    """

    def __init__(self, max_batches: int, max_items: int) -> None:
        self.max_batches = int(max_batches)
        self.max_items = int(max_items)
        size = 8 * (_HEADER + self.max_batches + 1 + self.max_items)
        self.segment = Segment.create("daliplan", size)
        if not self.segment.reserve(0, size):
            self.segment.close()
            raise CoordlError(f"DALILoader: no room for a {size}-byte batch plan in /dev/shm")
        self._arrays()
        self.header[:] = 0
        self.header[_H_EPOCH] = -1

    def _arrays(self) -> None:
        words = self.segment.array(np.int64, 0, _HEADER + self.max_batches + 1 + self.max_items)
        self.header = words[:_HEADER]
        self.offsets = words[_HEADER : _HEADER + self.max_batches + 1]
        self.indices = words[_HEADER + self.max_batches + 1 :]

    def write(self, epoch: int, batches: Sequence[Sequence[int]]) -> None:
        """Publish ``batches`` as DALI epoch ``epoch`` (no worker may be reading the plan)."""
        if len(batches) > self.max_batches:
            raise CoordlError(
                f"DALILoader: the sampler gave {len(batches)} batches, more than len()={self.max_batches}"
            )
        total = sum(len(b) for b in batches)
        if total > self.max_items:
            raise CoordlError(
                f"DALILoader: the sampler gave {total} items in an epoch, more than {self.max_items}"
            )
        self.header[_H_WRITING] = epoch
        self.header[_H_EPOCH] = -1  # invalid while being written
        self.offsets[0] = 0
        pos = 0
        for k, batch in enumerate(batches):
            self.indices[pos : pos + len(batch)] = batch
            pos += len(batch)
            self.offsets[k + 1] = pos
        self.header[_H_ITEMS] = pos
        self.header[_H_BATCHES] = len(batches)
        self.header[_H_EPOCH] = epoch

    def stop(self) -> None:
        """End the current epoch early: batches not yet scheduled are not fetched."""
        self.header[_H_BATCHES] = 0

    def batch(self, epoch: int, iteration: int) -> list[int] | None:
        """The indices of batch ``iteration`` of DALI epoch ``epoch``; None past the epoch's end."""
        current = int(self.header[_H_EPOCH])
        if epoch < current or (current == -1 and epoch < int(self.header[_H_WRITING])):
            return None  # a stale prefetch of an epoch that ended (or whose successor is being written)
        if epoch != current:
            raise CoordlError(f"DALILoader: DALI asked for epoch {epoch} but the plan holds epoch {current}")
        if iteration >= int(self.header[_H_BATCHES]):
            return None
        batch = self.indices[self.offsets[iteration] : self.offsets[iteration + 1]].tolist()
        # Read again after the copy: a stale prefetch still running while write() publishes the next
        # epoch may have copied half of each; it is stale, and DALI discards it.
        return batch if int(self.header[_H_EPOCH]) == epoch else None

    def __getstate__(self) -> dict[str, Any]:
        return {"segment": self.segment, "max_batches": self.max_batches, "max_items": self.max_items}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._arrays()

    def close(self) -> None:
        for name in ("header", "offsets", "indices"):
            self.__dict__.pop(name, None)  # views first, then the mapping
        self.segment.close()


def item_labels(source: Any) -> np.ndarray:
    """Every item's label as an int64 array, read without decoding any image.

    Looks, in order, for a public ``target(i)`` method (the item protocol's label accessor), the
    ``items`` list of coordl's file datasets (``(name, label)`` pairs, through their
    ``target_transform``), and ``dataset.samples`` of a torchvision-style dataset.
    """
    n = len(source)
    target = getattr(source, "target", None)
    if not callable(target):
        samples = getattr(getattr(source, "dataset", None), "samples", None)
        if samples is not None:
            target = lambda i: samples[i][1]  # noqa: E731
    if not callable(target):
        raise TypeError(
            f"DALILoader: cannot read labels of {type(source).__name__} without decoding: it needs a "
            "target(i) method (coordl.ImageFolder and FileListDataset have one)"
        )
    labels = np.empty(n, dtype=np.int64)
    for i in range(n):
        value = target(i)
        try:
            labels[i] = int(value)
        except (TypeError, ValueError):
            raise TypeError(
                f"DALILoader: item {i} of {type(source).__name__} has label {value!r}; DALILoader needs "
                "integer class labels"
            ) from None
    return labels


class BatchFeed:
    """DALI's external-source callback: ``BatchInfo -> (encoded images, labels)`` for one batch.

    Args:
        plan: the shared batch plan.
        reader: the loader's fetch path (tiers, then storage), counting hits and bytes.
        labels: every item's label.
        fetch_threads: storage reads in flight per worker process, for sources that declare
            ``thread_safe_fetch = True`` (0: read one item after another).
    """

    def __init__(self, plan: EpochPlan, reader: LoaderSource, labels: np.ndarray, fetch_threads: int) -> None:
        self.plan = plan
        self.reader = reader
        self.labels = labels
        self.fetch_threads = int(fetch_threads)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pool_pid = -1

    def __call__(self, info: Any) -> tuple[list[np.ndarray], list[np.ndarray]]:
        indices = self.plan.batch(int(info.epoch_idx), int(info.iteration))
        if indices is None:
            raise StopIteration
        return self.fetch_batch(indices)

    def fetch_batch(self, indices: list[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Encoded bytes (uint8 1-D arrays) and labels (int64, shape (1,)) of ``indices``."""
        # Cache hits here, storage reads in the pool (a hit handed to a thread cost ~70 us of this process's
        # time). Hits as views of their cache rows: DALI copies every array it is given into its own
        # batch before it calls again, and MinIO never rewrites a row.
        raws = self.reader.fetch_many(
            indices, self._threads() if self.fetch_threads > 1 else None, views=True
        )
        self.reader.counters.add("items_loaded", len(indices))
        images = [np.frombuffer(raw, dtype=np.uint8) for raw in raws]
        return images, [self.labels[i : i + 1] for i in indices]

    def _threads(self) -> concurrent.futures.ThreadPoolExecutor:
        # One pool per process: a forked copy of the parent's pool has no threads.
        if self._pool is None or self._pool_pid != os.getpid():
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.fetch_threads, thread_name_prefix="coordl-dali"
            )
            self._pool_pid = os.getpid()
        return self._pool

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pool"], state["_pool_pid"] = None, -1  # threads do not cross into a spawned worker
        return state

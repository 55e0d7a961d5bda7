"""``coordl.dali.DALILoader``: coordl's fetch side (MinIO, partitioned, coordinated) feeding DALI's prep.

A CPU core decodes and augments some 500-900 ImageNet-sized JPEGs per second; one modern GPU trains
ResNet-50 at 2,500-3,000 images per second. Users with GPUs therefore prep on the GPU with DALI. This
loader gives them coordl's fetch side underneath:

* raw bytes come from the same fetch chain as ``coordl.DataLoader`` (:class:`coordl.fetch.chain.FetchChain`:
  the MinIO cache, the partitioned cache's peers, staged NFS, storage), read in DALI's parallel
  ``external_source`` worker processes (:mod:`coordl.dali.feed`);
* decode and augmentation run in DALI: nvJPEG (``device="mixed"``) and GPU operators with
  ``device="gpu"``, DALI's CPU operators with ``device="cpu"`` (:mod:`coordl.dali.ops`);
* batch order comes from torch's own sampler machinery with the same arguments as
  ``coordl.DataLoader`` (shuffle, generator, sampler, drop_last; ``PartitionedSampler`` when
  ``partitioned=True``), so both loaders yield the same batches for the same seed;
* ``coordinate=``: jobs on one server fetch each batch once and share its raw bytes
  (:mod:`coordl.dali.coordinated`);
* ``stats()`` / ``epoch_stats()`` with the keys of ``coordl.DataLoader``.

The parts, each in a module named for it: the batch order (:mod:`coordl.dali.order`), what the external
source is fed each epoch (:mod:`coordl.dali.feeding`), the pipeline and its restarts
(:mod:`coordl.dali.pipeline`); this class composes them and runs the epochs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch

from coordl.dali.feed import item_labels
from coordl.dali.feeding import EpochFeed
from coordl.dali.ops import DALITransform, train_pipeline
from coordl.dali.options import device_id_for, validate
from coordl.dali.order import BatchOrder
from coordl.dali.pipeline import PipelineRun, find_corrupt
from coordl.datasets.adapt import as_item_source
from coordl.datasets.source import is_item_source
from coordl.epoch import EpochStats, LoaderStats
from coordl.errors import CoordlError
from coordl.fetch.chain import FetchChain
from coordl.fetch.pipeline import BASE_COUNTERS, FetchTier, LoaderSource
from coordl.partitioned.options import PartitionedOptions, check_partitioned
from shmem.counters import SharedCounters

__all__ = ["DALILoader"]

# Storage reads in flight per DALI worker process (for sources whose fetch is thread-safe): enough to
# keep a throttled disk or an NFS server busy while the batch is assembled.
DEFAULT_FETCH_THREADS = 8


class DALILoader(LoaderStats):
    """Iterate ``(images, labels)`` batches, prepped by NVIDIA DALI, with coordl's caches underneath.

    Args:
        dataset: any dataset with the item protocol (``len``, ``fetch``, ``prep``; ``coordl.ImageFolder``
            included) or a torchvision-style dataset; items must be encoded images with integer labels.
        batch_size, shuffle, sampler, drop_last, generator: as in ``torch.utils.data.DataLoader``.
        device: "cpu" (DALI's CPU decoder and operators) or "gpu" (nvJPEG and GPU operators; batches
            are CUDA tensors on ``device_id``).
        transform: the DALI prep, :func:`coordl.dali.train_pipeline` (default, size 224) or
            :func:`coordl.dali.eval_pipeline`.
        cache_bytes, cache_dir, partitioned: the MinIO cache and the partitioned cache, exactly as in
            ``coordl.DataLoader``.
        coordinate: share each batch's raw bytes with the other jobs of this group on the server.
        num_threads: DALI's CPU threads (decode with ``device="cpu"``; header parsing and host work
            with ``device="gpu"``). Default: the cores this process may run on.
        py_num_workers: processes that fetch raw bytes for DALI (0: fetch in the main thread).
        py_start_method: how DALI starts those processes: "fork" (cheap; impossible once CUDA is
            initialised in this process) or "spawn" (the feed is pickled: the dataset must pickle).
            Default: "fork" while CUDA is not initialised here, else "spawn".
        fetch_threads: storage reads in flight per worker (default 8 for thread-safe sources, else 0).
        prefetch_queue_depth: batches DALI prepares ahead of the one being consumed.
        seed: DALI's seed for the random augmentation (None: a random one).
        device_id: the GPU for ``device="gpu"`` (default: ``LOCAL_RANK``, else the current device).
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        drop_last: bool = False,
        generator: torch.Generator | None = None,
        *,
        device: str = "cpu",
        transform: DALITransform | None = None,
        cache_bytes: int = 0,
        cache_dir: str | None = None,
        partitioned: bool | PartitionedOptions = False,
        coordinate: Any = None,
        num_threads: int | None = None,
        py_num_workers: int = 1,
        py_start_method: str | None = None,
        fetch_threads: int | None = None,
        prefetch_queue_depth: int = 2,
        seed: int | None = None,
        device_id: int | None = None,
    ) -> None:
        """Why this function is long: the signature mirrors coordl.DataLoader's options (one per line);
        the body composes the parts in order, one statement per part."""
        validate(batch_size, device, cache_bytes, py_num_workers, py_start_method, prefetch_queue_depth)
        self._closed = False
        self._final_stats: dict[str, Any] | None = None
        self.dataset = dataset
        self.batch_size = batch_size
        self.cache_bytes = int(cache_bytes)
        self.device = device
        self.transform = transform if transform is not None else train_pipeline(224)
        self.source = dataset if is_item_source(dataset) else as_item_source(dataset)
        if getattr(self.source, "opaque", False):
            raise TypeError(
                f"DALILoader needs raw encoded images, but {type(dataset).__name__} has no fetch/prep split; "
                "use coordl.ImageFolder / FileListDataset or implement fetch(i)"
            )
        self.labels = item_labels(self.source)
        self._counters = SharedCounters(list(BASE_COUNTERS))
        self._epoch_stats = EpochStats(BASE_COUNTERS)
        check_partitioned(partitioned)
        self._chain = FetchChain(self.source, self._counters, cache_bytes=cache_bytes, cache_dir=cache_dir,
                                 partitioned=partitioned, name=type(dataset).__name__)  # fmt: skip
        thread_safe = getattr(self.source, "thread_safe_fetch", False) is True
        self._reader = LoaderSource(self.source, self._chain.tiers, self._counters)
        self._order = BatchOrder(
            len(self.source), batch_size, shuffle, sampler, drop_last, generator, bool(partitioned)
        )
        threads = (
            fetch_threads if fetch_threads is not None else (DEFAULT_FETCH_THREADS if thread_safe else 0)
        )
        self._feed = EpochFeed(
            self._order, self._reader, self.labels, batch_size=batch_size, drop_last=drop_last,
            coordinate=coordinate, py_num_workers=py_num_workers, fetch_threads=threads,
        )  # fmt: skip
        self.device_id = device_id_for(device, device_id)
        options = {
            "batch_size": batch_size, "device": device, "device_id": self.device_id,
            "py_num_workers": self._feed.py_num_workers, "py_start_method": py_start_method,
            "prefetch_queue_depth": prefetch_queue_depth, "seed": None if seed is None else int(seed),
        }  # fmt: skip
        self._dali = PipelineRun(self._feed.callback, self.transform, self._reader, self.source, options,
                                 num_threads or len(os.sched_getaffinity(0)))  # fmt: skip
        self._build()
        self._in_epoch = False
        self._consumed = 0  # batches handed out in the current epoch

    def _build(self) -> None:
        """Build DALI's pipeline and iterator; on failure close this loader and say why."""
        try:
            self._dali.build()
        except RuntimeError as e:
            self.close()
            if self.device == "gpu" and "CUDA" in str(e):
                raise RuntimeError(
                    f"DALILoader(device='gpu') needs a CUDA device; use device='cpu' ({e})"
                ) from e
            raise

    def _rebuild_if_changed(self) -> None:
        """Restart DALI (and its workers) when something they copied at start has changed since."""
        if self._dali.changed():
            self._dali.shutdown()
            self._build()

    # -- what profilers may change between epochs --------------------------------------------------

    @property
    def num_workers(self) -> int:
        """DALI's CPU threads (its prep capacity on the CPU). Settable between epochs: DALI restarts."""
        return self._dali.num_threads

    @num_workers.setter
    def num_workers(self, workers: int) -> None:
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
            raise ValueError(f"num_workers must be an int >= 0, got {workers!r}")
        self._dali.num_threads = max(1, workers)  # DALI needs a thread; 0 means "as few as possible"

    def add_fetch_tier(self, tier: FetchTier) -> None:
        """Ask ``tier`` for raw bytes before every other tier, from the next epoch on (DALI restarts)."""
        self._reader.tiers.insert(0, tier)

    def remove_fetch_tier(self, tier: FetchTier) -> None:
        """Undo :meth:`add_fetch_tier` (a tier that was not added is ignored)."""
        if tier in self._reader.tiers:
            self._reader.tiers.remove(tier)

    # -- iteration ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._feed)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._closed:
            raise RuntimeError("this coordl.dali.DALILoader was closed")
        self._finish_epoch()
        self._epoch_stats.end(self._counters.snapshot(), complete=False)  # an epoch an error ended
        self._rebuild_if_changed()
        self._epoch_stats.begin(self._counters.snapshot())
        batches = self._feed.start(self._dali.epoch + 1)
        self._dali.next_epoch()  # DALI's next epoch: its workers start fetching from the new plan
        self._in_epoch = True
        return self._epoch(batches)

    def _epoch(self, batches: list[list[int]]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        k = self._consumed = 0
        while True:
            try:
                out = next(self._dali.iterator)
            except StopIteration:
                break
            except Exception as e:
                ahead = self._dali.options["prefetch_queue_depth"] + 2  # DALI may report a batch it ran ahead
                raise self._batch_error(e, batches[k : k + ahead]) from e
            k += 1
            self._consumed = k
            yield out[0]["data"], out[0]["label"].view(-1)
        self._in_epoch = False
        self._chain.end_epoch()  # items read from storage reach their owners first (partitioned=)
        self._epoch_stats.end(self._counters.snapshot(), complete=True)

    def _finish_epoch(self) -> None:
        """End an epoch the user left early: stop fetching, drain what DALI already has in flight."""
        if not self._in_epoch:
            return
        self._feed.stop()
        try:
            for _ in self._dali.iterator:
                pass
        except Exception:  # noqa: BLE001 - a batch the user no longer wants; the next epoch reports it
            self._dali.restart_next_epoch()
        self._in_epoch = False
        self._order.replay(self._consumed)  # the generator where torch's DataLoader would have left it
        self._epoch_stats.end(self._counters.snapshot(), complete=False)

    def _batch_error(self, error: Exception, candidates: list[list[int]]) -> Exception:
        """Name the corrupt file when DALI's decoder failed on one, else wrap DALI's error."""
        self._in_epoch = False
        self._dali.restart_next_epoch()  # DALI's state after an error is unknown
        bad = find_corrupt(self.source, [i for b in candidates for i in b])
        if bad is not None:
            return bad
        return CoordlError(f"DALILoader: DALI failed on a batch of {type(self.dataset).__name__}: {error}")

    # -- stats -------------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Totals since construction, summed over DALI's worker processes: ``coordl.DataLoader``'s keys.

        ``cache_hits``, ``cache_misses``, ``storage_bytes_read``, ``storage_items_read``,
        ``items_loaded``, ``skipped_items`` (always 0: DALI cannot drop a sample from a batch),
        ``cached_items``, ``cached_bytes``, ``capacity_bytes``, ``cache_backend``, plus the dataset's own
        ``stats()`` and each fetch tier's.
        """
        return super().stats()

    def _stat_parts(self) -> tuple[Any, ...]:
        return (self._chain,)

    # -- lifetime ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop DALI's workers and free the shared memory now (also done at interpreter exit)."""
        if self._closed:
            return
        self._final_stats = self.stats()
        self._closed = True
        self._dali.shutdown()
        for obj in (self._feed, self._chain, self._counters, self._reader):
            obj.close()

    def __enter__(self) -> DALILoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        cache = f", cache={self._chain.minio!r}" if self._chain.minio is not None else ""
        return (
            f"coordl.dali.DALILoader({type(self.dataset).__name__}, batch_size={self.batch_size}, "
            f"device={self.device!r}{cache})"
        )

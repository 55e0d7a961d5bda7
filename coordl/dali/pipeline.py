"""The DALI pipeline of a ``DALILoader``: external source -> prep graph -> PyTorch iterator.

One pipeline per loader, built once. Its input is a batched ``external_source`` driven by a
callback (:class:`coordl.dali.feed.BatchFeed`, or the coordinated feed) that returns the batch's
encoded images and labels; with ``py_num_workers > 0`` the callback runs in DALI's Python worker
processes (``parallel=True``), ``prefetch_queue_depth`` batches ahead of the pipeline. The output
goes through ``nvidia.dali.plugin.pytorch.DALIGenericIterator``, which copies each batch into torch
tensors (CUDA tensors on the pipeline's stream for ``device="gpu"``).

The iterator is built with ``prepare_first_batch=False`` and ``auto_reset=False``: the loader writes
each epoch's plan before it lets DALI start that epoch (``reset()``), so no worker ever fetches a
batch of an epoch whose order is not decided yet.

:class:`PipelineRun` holds a loader's pipeline and iterator between epochs: DALI's worker processes
copy the fetch path when they start, so the loader restarts the pipeline when that has changed
(:meth:`PipelineRun.changed`), and counts DALI's epochs (one per ``reset()``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from coordl.dali.ops import DALITransform
from coordl.dali.options import start_method
from coordl.errors import CorruptItemError

__all__ = ["build_iterator", "find_corrupt", "PipelineRun"]


def build_iterator(
    feed: Callable[[Any], Any],
    transform: DALITransform,
    *,
    batch_size: int,
    device: str,
    device_id: int | None,
    num_threads: int,
    py_num_workers: int,
    py_start_method: str,
    prefetch_queue_depth: int,
    seed: int | None,
) -> tuple[Any, Any]:
    """Build the pipeline and its iterator; returns ``(pipeline, iterator)``.

    ``device_id=None`` makes a CPU-only pipeline (DALI then never touches CUDA). With
    ``py_start_method="fork"`` DALI forks its workers inside ``build()``, before the pipeline
    initialises CUDA itself.
    """
    try:
        from nvidia.dali import fn, types
        from nvidia.dali.pipeline import Pipeline
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    except ImportError as e:
        raise ImportError(
            "coordl.dali needs NVIDIA DALI: pip install -e .[dali] (the nvidia-dali-cuda130 wheel; its CPU "
            "backend runs without a GPU)"
        ) from e
    parallel = py_num_workers > 0
    pipe = Pipeline(
        batch_size=batch_size,
        num_threads=num_threads,
        device_id=device_id,
        seed=seed,
        prefetch_queue_depth=prefetch_queue_depth,
        py_num_workers=max(1, py_num_workers),
        py_start_method=py_start_method,
    )
    # In parallel mode, batches the workers compute ahead (DALI refuses it otherwise).
    ahead: dict[str, Any] = {"prefetch_queue_depth": prefetch_queue_depth} if parallel else {}
    with pipe:
        jpegs, labels = fn.external_source(
            source=feed,
            num_outputs=2,
            batch=True,
            batch_info=True,
            parallel=parallel,
            dtype=[types.UINT8, types.INT64],
            **ahead,
        )
        images = transform(jpegs, device)
        if device == "gpu":
            labels = labels.gpu()
        pipe.set_outputs(images, labels)
    pipe.build()
    iterator = DALIGenericIterator(
        [pipe],
        ["data", "label"],
        auto_reset=False,
        last_batch_policy=LastBatchPolicy.PARTIAL,
        prepare_first_batch=False,
    )
    return pipe, iterator


def find_corrupt(source: Any, indices: list[int]) -> CorruptItemError | None:
    """The first of ``indices`` whose bytes do not decode on the CPU, as a CorruptItemError naming it.

    DALI reports a decode failure for a whole batch (and, with prefetching, not always the batch being
    read); the loader asks this about the batches that may have failed, so the user gets the file.
    """
    from coordl.datasets.source import describe_item
    from coordl.prep.decode import decode_image

    for index in indices:
        try:
            decode_image(source.fetch(index))
        except CorruptItemError as e:
            path = describe_item(source, index)
            return CorruptItemError(f"{path}: DALI could not decode it ({e})", path=path, index=index)
        except Exception:  # noqa: BLE001 - a second failure must not hide the first
            continue
    return None


class PipelineRun:
    """A loader's DALI pipeline and iterator, and what DALI's workers copied when they started.

    Args:
        feed: the external-source callback.
        reader, source: the loader's fetch path and dataset (watched: their tiers and ``fetch``).
        options: :func:`build_iterator`'s keyword arguments other than ``num_threads``
            (``py_start_method`` as asked: None is decided at each build).
        num_threads: DALI's CPU threads; settable, it takes effect at the next restart.
    """

    def __init__(self, feed: Callable[[Any], Any], transform: DALITransform, reader: Any, source: Any,
                 options: dict[str, Any], num_threads: int) -> None:  # fmt: skip
        self.feed, self.transform, self.reader, self.source = feed, transform, reader, source
        self.options = options
        self.num_threads = num_threads
        self.pipe: Any = None
        self.iterator: Any = None
        self.built_with: tuple = ()
        self.epoch = -1  # DALI's epoch counter: +1 at each pipeline reset

    def build(self) -> None:
        """Build DALI's pipeline and iterator; its worker processes start (fork or spawn) here."""
        opts = dict(self.options, py_start_method=start_method(self.options["py_start_method"]))
        self.pipe, self.iterator = build_iterator(
            self.feed, self.transform, num_threads=self.num_threads, **opts
        )
        self.built_with = self.what_workers_see()
        self.epoch = -1

    def what_workers_see(self) -> tuple:
        """What DALI's worker processes copied when they started: the fetch tiers, the source's
        ``fetch`` (a profiler may replace it on the instance) and the thread count."""
        return (
            tuple(id(t) for t in self.reader.tiers),
            id(self.source.__dict__.get("fetch")),
            self.num_threads,
        )

    def changed(self) -> bool:
        """Whether something the workers copied at start has changed since (or a restart was asked for)."""
        return self.what_workers_see() != self.built_with

    def restart_next_epoch(self) -> None:
        """Have the next epoch restart DALI: its state after an error is unknown."""
        self.built_with = ()

    def next_epoch(self) -> None:
        """Let DALI start its next epoch (its workers fetch from the plan written for it)."""
        if self.epoch >= 0:
            self.iterator.reset()
        self.epoch += 1

    def shutdown(self) -> None:
        """Stop DALI's pipeline and its workers."""
        self.iterator = None
        if self.pipe is not None:
            self.pipe._shutdown()  # DALI has no public close(); this is what its __del__ does
            self.pipe = None

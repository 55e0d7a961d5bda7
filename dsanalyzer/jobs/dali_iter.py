"""The differential runs for a plain NVIDIA DALI iterator (a user's own DALI pipeline).

``nvidia.dali.plugin.pytorch.DALIGenericIterator`` (and its subclass ``DALIClassificationIterator``)
is its own iterator: ``__next__`` runs the pipeline and returns a list with one dict of torch tensors
per pipeline; at an epoch's end it raises StopIteration and needs ``reset()`` (done by itself with
``auto_reset=True``, and by ``iter()`` after a consumed epoch). It has no dataset, no item source and
no worker count to change, so :func:`dsanalyzer.jobs.prepare` hands it to :func:`prepare_run`:

``prep_scaling``  dataset size from the readers' files, their cold read rate (one thread per reader:
                  a DALI reader reads its files with one), then the iterator alone, files in the page
                  cache, at the pipeline's own ``num_threads`` only: a built pipeline cannot change
                  it, so the other counts are listed under ``skipped`` and no point is made up.
``compute``       one batch taken and replayed: the same tensors on the same device, and the pipeline
                  never runs again. With GPU decode the replayed batch stays on the GPU and the GPU
                  decodes nothing, so whatever GPU prep adds to the step in the other runs (it shares
                  the device) is prep stall, not compute.
``prep``          the readers' files read into the page cache first, when they fit the memory budget
                  (else ``memory.method`` says so, with both numbers).
``real``          the readers' files dropped from the page cache (``posix_fadvise DONTNEED``).

Files come from the pipeline's reader operators (:mod:`dsanalyzer.jobs.dali_readers`), else from
``--data DIR``; with neither, the report's ``dataset.size_note`` names the flag. Never imports DALI.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Any

from dsanalyzer.jobs import dali_readers
from dsanalyzer.measure import fetchrate, runs

__all__ = ["DALI_MODULE", "is_dali_iterator", "restart", "take_batch", "prepare_run", "close"]

DALI_MODULE = "nvidia.dali.plugin.pytorch"

NO_FILES = (
    "the DALI pipeline's readers name no files (an external_source or another input); give the "
    "dataset's directory with --data DIR (dsanalyzer profile) or data_path=DIR (dsanalyzer.profile)"
)


def is_dali_iterator(obj: Any) -> bool:
    """True for a ``DALIGenericIterator`` or a subclass (checked by name: DALI is not imported)."""
    return any(
        cls.__name__ == "DALIGenericIterator" and cls.__module__ == DALI_MODULE for cls in type(obj).__mro__
    )


def _pipelines(it: Any) -> list[Any]:
    return list(getattr(it, "_pipes", None) or [])


def restart(it: Any) -> Any:
    """``it``, ready for its next epoch (a DALI iterator is its own iterator)."""
    if getattr(it, "_auto_reset", "no") != "yes":
        iter(it)  # DALI's __iter__ resets the iterator after a consumed epoch, and only then
    return it


def _same_device_copy(batch: Any) -> Any:
    if isinstance(batch, list):
        return [_same_device_copy(b) for b in batch]
    if isinstance(batch, dict):
        return {k: _same_device_copy(v) for k, v in batch.items()}
    clone = getattr(batch, "clone", None)
    return clone() if callable(clone) else batch


def take_batch(it: Any) -> Any:
    """One batch of ``it``, copied on its own device (the copy owns its memory, whatever DALI does
    with its output buffers later; a GPU batch stays on the GPU)."""
    try:
        batch = next(it)
    except StopIteration:
        raise RuntimeError(
            f"the DALI iterator ({type(it).__name__}) yielded no batches: nothing to profile"
        ) from None
    return _same_device_copy(batch)


def _facts(it: Any, ops: list[dali_readers.Op]) -> dict:
    """:func:`dsanalyzer.jobs.torch_loader.loader_facts`'s keys for a DALI iterator, plus where its prep runs."""
    pipes = _pipelines(it)
    first = pipes[0] if pipes else None
    return {
        "class": f"{type(it).__module__}.{type(it).__qualname__}",
        "batch_size": int(getattr(it, "batch_size", 1) or 1) * max(1, len(pipes)),
        "num_workers": int(getattr(first, "num_threads", 0) or 0),  # DALI's CPU threads
        "prefetch_factor": getattr(first, "prefetch_queue_depth", None),
        "cache_bytes": 0,
        "pipelines": len(pipes),
        "prep_device": dali_readers.prep_device(ops),
    }


def _files_and_dataset(it: Any, ops: list[dali_readers.Op], data_path: str | None) -> tuple[list[str], dict]:
    """The files the pipeline reads and the report's ``dataset`` section."""
    files, readers = dali_readers.reader_files(ops)
    source = "the pipeline's readers"
    if not files and data_path:
        files, source = fetchrate.files_under(data_path), "--data"
    pipes = _pipelines(it)
    epoch = dali_readers.epoch_items(pipes[0]) if pipes else None
    items = epoch or len(files)
    total = runs.files_bytes(files)
    dataset: dict = {
        "items": int(items),
        "bytes": total,
        "avg_item_bytes": total / items if files and items else None,
        "path": os.path.abspath(os.path.commonpath(files)) if files else None,
        "files": len(files),
        "files_from": source if files else None,
        "readers": readers,
    }
    if not files:
        dataset["size_note"] = NO_FILES
    return files, dataset


def _resident(files: list[str]) -> float:
    """Page-cache residency of (a sample of at most 1,000 of) the files, by ``mincore``."""
    sample = files if len(files) <= 1000 else random.Random(0).sample(files, 1000)
    return fetchrate.resident_fraction(sample)


def _warm(files: list[str], budget_bytes: int) -> dict:
    """Read the files into the page cache when they all fit ``budget_bytes``; the report's ``memory``."""
    if not files:
        return {"method": f"none: {NO_FILES}", "items": 0, "bytes": 0, "resident_fraction": 0.0}
    total = runs.files_bytes(files)
    if total > budget_bytes:
        return {
            "method": f"none: the readers' files ({total:,} bytes) do not fit the memory budget "
            f"({budget_bytes:,} bytes); the prep run reads what is not already cached from storage",
            "items": 0,
            "bytes": 0,
            "dataset_bytes": total,
            "budget_bytes": budget_bytes,
            "resident_fraction": _resident(files),
        }
    n_files, n_bytes = fetchrate.warm_files(files, budget_bytes)
    info = {"method": "the readers' files read into the page cache", "items": n_files, "bytes": n_bytes}
    return {**info, "resident_fraction": _resident(files)}


def _fetch_rate(files: list[str], dataset: dict, readers: int) -> dict:
    """Cold read rate of the readers' files, with one thread per reader (as DALI reads them)."""
    if not files:
        return {"error": NO_FILES}
    fetch = fetchrate.measure_fetch_rate(files=files, threads=max(1, readers))
    avg = dataset.get("avg_item_bytes")
    if avg and dataset["items"] != len(files):  # shards (TFRecord, tar): files are not items
        fetch["items_per_s"] = fetch["bytes_per_s"] / avg
        fetch["method"] += "; items/s = bytes/s over the mean item size (a file holds several items)"
    return fetch


def _prep_scaling(
    plan: Any, it: Any, files: list[str], dataset: dict, progress: Callable[[int, int], None] | None
) -> dict:
    """Dataset, cold fetch rate, then the iterator alone at the pipeline's own thread count."""
    readers = len(dataset["readers"]) or 1
    info: dict = {"dataset": dataset, "fetch": _fetch_rate(files, dataset, readers)}
    info["memory"] = _warm(files, plan.memory_budget_bytes)
    pipes = _pipelines(it)
    threads = int(getattr(pipes[0], "num_threads", 1) or 1) if pipes else 1
    total = plan.warmup + plan.iters
    done = [0]

    def tick() -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], total)

    rate = runs.loader_alone_rate(it, lambda: restart(it), plan.iters, plan.warmup, tick)
    why = f"a built DALI pipeline keeps its num_threads ({threads}); build it with num_threads=K to measure K"
    scaling: dict = {"workers": [threads], "samples_per_s": [rate]}
    skipped = {str(k): why for k in plan.workers_list if k != threads}
    if skipped:
        scaling["skipped"] = skipped
    scaling["note"] = f"DALI iterator: prep measured at the pipeline's own num_threads={threads} only"
    info["scaling"] = scaling
    return info


def prepare_run(
    plan: Any, it: Any, progress: Callable[[int, int], None] | None = None
) -> tuple[dict, Any | None]:
    """Set a DALI iterator up for ``plan.mode`` (a :class:`dsanalyzer.measure.plan.RunPlan`).

    Returns the facts to record and, for the compute run, the batch to replay (else None).
    """
    ops = [op for pipe in _pipelines(it) for op in dali_readers.pipeline_ops(pipe)]
    info: dict = {"loader": _facts(it, ops)}
    if plan.mode == "compute":
        return info, take_batch(it)
    files, dataset = _files_and_dataset(it, ops, plan.data_path)
    if plan.mode == "prep_scaling":
        info.update(_prep_scaling(plan, it, files, dataset, progress))
    elif plan.mode == "prep":
        info["memory"] = _warm(files, plan.memory_budget_bytes)
    elif plan.mode == "real":
        info["cold"] = runs.evict_cold(files)
        if not files:
            info["cold"]["note"] = NO_FILES
    else:
        raise ValueError(f"run mode {plan.mode!r} is not one of prep_scaling, compute, prep, real")
    return info, None


def close(it: Any) -> None:
    """Stop the iterator's pipelines now (threads, worker processes, device memory), as DALI's own
    ``Pipeline.__del__`` would at garbage collection; DALI has no public close."""
    for pipe in _pipelines(it):
        shutdown = getattr(pipe, "_shutdown", None)
        if callable(shutdown):
            shutdown()

"""torch's DataLoader (and coordl's, which is one) as a job kind: what each differential run changes in it.

Both front ends call :func:`dsanalyzer.jobs.prepare`, which hands such a loader to :func:`prepare`
here: the import hook inside an unmodified script (:mod:`dsanalyzer.intercept`) and the Python API
(:func:`dsanalyzer.profile`). They differ only in how they obtain an iterator (a patched
``__iter__`` vs a plain call), which they pass in.

``prepare(plan, loader, open_iter)`` returns a :class:`~dsanalyzer.measure.plan.Prepared`: the facts
to record in the run's result (``info``), for the compute run the replayed batch, and ``undo`` to put
the loader back (a dataset object may be shared by the next run's loader). Where the loader's items
come from and how they are served from memory: :mod:`dsanalyzer.jobs.item_source`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

from dsanalyzer.jobs import item_source
from dsanalyzer.jobs.coordl_loader import fetch_ahead, is_coordl_loader, remedy_probes, remote_facts
from dsanalyzer.measure import apply, callsite, fetchrate, gpu_prep, itemsize, objectstore, peer, runs
from dsanalyzer.measure.plan import MODES, Prepared, RunPlan
from dsanalyzer.model.store import loader_concurrency

__all__ = ["prepare", "loader_facts", "set_workers", "take_one_batch"]


def loader_facts(loader: Any) -> dict:
    """The loader's settings that the report and the what-if model need."""
    return {
        "class": f"{type(loader).__module__}.{type(loader).__qualname__}",
        "batch_size": getattr(loader, "batch_size", None) or 1,
        "num_workers": int(getattr(loader, "num_workers", 0) or 0),
        "fetch_ahead": fetch_ahead(loader),
        "prefetch_factor": getattr(loader, "prefetch_factor", None),
        "cache_bytes": int(getattr(loader, "cache_bytes", 0) or 0),
        "drop_last": bool(getattr(loader, "drop_last", False)),
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
        "in_order": bool(getattr(loader, "in_order", True)),
        "batches_per_epoch": _batches_per_epoch(loader),
        "torch_threads": _torch_threads(),
        "site": callsite.site_of(loader),  # the script's line that built it (the fix's patch goes there)
        "applied": apply.applied(),  # what a fix's change did in this run (dsanalyzer.measure.apply)
        **remote_facts(loader),
    }


def _torch_threads() -> int | None:
    """torch's intra-op threads in this (the main) process: the step's threads beside the workers."""
    torch = sys.modules.get("torch")
    get = getattr(torch, "get_num_threads", None)
    return int(get()) if callable(get) else None


def _batches_per_epoch(loader: Any) -> int | None:
    """``len(loader)`` where the loader knows it (an iterable dataset may not): None otherwise."""
    try:
        return int(len(loader))
    except Exception:  # noqa: BLE001 - any loader's __len__ may refuse (TypeError, NotImplementedError)
        return None


def _items_needed(plan: RunPlan, loader: Any) -> int:
    """Items a run touches: its iterations plus what the workers prefetch."""
    batch = getattr(loader, "batch_size", None) or 1
    workers = int(getattr(loader, "num_workers", 0) or 0)
    prefetch = getattr(loader, "prefetch_factor", None) or 2
    return (plan.warmup + plan.iters + 2 + workers * prefetch) * batch


def _prep_scaling(
    plan: RunPlan,
    loader: Any,
    fresh_iter: Callable[[], Iterator],
    progress: Callable[[int, int], None] | None,
) -> Prepared:
    """Dataset size, cold fetch rate, then the loader alone (items from memory) at each worker count."""
    files = item_source.loader_files(loader, plan.data_path)
    info: dict = {"dataset": item_source.dataset_info(loader, files)}
    bucket = (
        None
        if plan.data_path
        else objectstore.find_bucket(getattr(loader, "dataset", None), getattr(loader, "source", None))
    )
    if bucket is not None:  # an object store: probed at the loader's concurrency, not read cold as files
        _probe_bucket(info, loader, bucket)
    elif not files:  # nothing lists the files: watch which files the dataset opens
        traced = item_source.traced_files(loader)
        info["dataset"] = itemsize.merge(info["dataset"], traced)
        files = traced.get("files") or []
    source = item_source.find_item_source(loader)
    threads = max(1, int(getattr(loader, "num_workers", 0) or 0))
    if bucket is None:
        info["fetch"] = _cold_fetch_rate(files, source, threads, plan.data_path)
    info.update(_remedy_probes(info["dataset"], source, loader))
    info["memory"], undo = item_source.serve_from_memory(
        loader, _items_needed(plan, loader), plan.memory_budget_bytes, plan.data_path
    )
    # 1..cores, plus the script's own worker count when it asks for more workers than cores.
    ks = sorted(set(plan.workers_list) | ({threads} if getattr(loader, "num_workers", 0) else set()))
    total = len(ks) * (plan.warmup + plan.iters)
    try:
        info["scaling"] = runs.measure_prep_scaling(
            loader,
            fresh_iter,
            ks,
            plan.iters,
            plan.warmup,
            progress=(lambda n: progress(n, total)) if progress is not None else None,
            set_workers=set_workers,
        )
        # items still from memory: the probes for coordinated prep and the sample cache (a second or two)
        info["remedy_probes"] = remedy_probes(loader, lambda: take_one_batch(loader, fresh_iter))
        info["prep_spread"] = item_source.prep_spread(loader)  # per-sample prep times (at most 2 s)
    finally:
        undo()
    if bucket is not None and str(info["memory"].get("method", "")).startswith("none"):
        # a dataset that GETs its objects itself: its loader-alone run waited for the bucket too
        info["scaling"] = objectstore.prep_without_fetch(info["scaling"], info["source"])
    return Prepared(info)


def _cold_fetch_rate(files: list[str], source: Any, threads: int, data_path: str | None) -> dict:
    """Files read cold, or the item source's ``fetch`` (what the job reads storage with: it may front a
    remote or rate-limited store), its files evicted first so that reads are cold."""
    try:
        if source is not None and not data_path:
            fetchrate.evict_files(files)
        return fetchrate.measure_fetch_rate(
            files=None if source is not None and not data_path else (files or None),
            source=source,
            threads=threads,
        )
    except ValueError as e:
        return {"error": str(e)}


def _remedy_probes(dataset: dict, source: Any, loader: Any) -> dict:
    """The remedies' probes (report.json's ``peer`` and ``gpu_prep``): a remote hit of the partitioned cache
    on loopback Redis (:mod:`~dsanalyzer.measure.peer`), GPU prep of the job's own items
    (:mod:`~dsanalyzer.measure.gpu_prep`; on a machine without a GPU only the reason, at once)."""
    avg = float(dataset.get("avg_item_bytes") or 0.0)
    batch = int(getattr(loader, "batch_size", None) or 1)
    out: dict = {"gpu_prep": gpu_prep.probe_gpu_prep(source)}
    out["peer"] = peer.measure_peer_fetch(avg, batch) if avg > 0 else {"error": "the dataset reads no files"}
    return out


def _probe_bucket(info: dict, loader: Any, bucket: objectstore.BucketSource) -> None:
    """The bucket's ``source`` section, its ``fetch`` rates at the loader's concurrency, the dataset's size."""
    workers = int(getattr(loader, "num_workers", 0) or 0)
    ahead = fetch_ahead(loader)
    concurrency = loader_concurrency(workers, ahead)
    source = objectstore.bucket_section(bucket, concurrency, ahead, workers)
    info["source"] = source
    info["fetch"] = source.get("fetch") or {"error": source.get("probe_error", "the bucket was not probed")}
    avg = source.get("mean_object_bytes")
    if avg:
        items = int(info["dataset"].get("items") or len(bucket.keys))
        info["dataset"] = {
            **info["dataset"], "items": items, "avg_item_bytes": avg, "bytes": int(avg * items),
            "path": source["url"], "size_method": f"mean object size from {source['size_method']}",
        }  # fmt: skip
        info["dataset"].pop("size_note", None)


def prepare(
    plan: RunPlan,
    loader: Any,
    open_iter: Callable[[], Iterator],
    fresh_iter: Callable[[], Iterator] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Prepared:
    """Set ``loader`` up for ``plan.mode`` (the prep-scaling run is measured here entirely).

    Args:
        plan: the run.
        loader: the loader the job iterates (torch's or coordl's).
        open_iter: a new iterator of the loader, as the job would get it.
        fresh_iter: a new iterator with new workers (torch's ``__iter__`` reuses persistent ones);
            defaults to ``open_iter``.
        progress: called with (done, total) iterations during the prep-scaling run.
    """
    fresh = fresh_iter or open_iter
    facts = {"loader": loader_facts(loader)}
    if plan.mode == "prep_scaling":
        done = _prep_scaling(plan, loader, fresh, progress)
        done.info.update(facts)
        return done
    if plan.mode == "compute":
        return Prepared(facts, replay=runs.ReplayIterator(take_one_batch(loader, fresh)))
    if plan.mode == "prep":
        memory, undo = item_source.serve_from_memory(
            loader, _items_needed(plan, loader), plan.memory_budget_bytes, plan.data_path
        )
        return Prepared({**facts, "memory": memory}, undo=undo)
    if plan.mode == "real":
        return Prepared({**facts, "cold": item_source.start_cold(loader, plan.data_path)})
    raise ValueError(f"run mode {plan.mode!r} is not one of {', '.join(MODES)}")


def set_workers(loader: Any, workers: int) -> None:
    """Change a loader's worker count between iterators.

    torch's ``num_workers`` is a plain attribute (prefetch then needs a value); coordl's is a public
    property that takes effect at the next ``iter``.
    """
    loader.num_workers = workers
    if not is_coordl_loader(loader) and workers > 0 and getattr(loader, "prefetch_factor", 2) is None:
        loader.prefetch_factor = 2


def take_one_batch(loader: Any, open_iter: Callable[[], Iterator]) -> Any:
    """One real batch, prepared in this process (no worker start-up), workers restored after."""
    workers = getattr(loader, "num_workers", 0)
    set_workers(loader, 0)
    try:
        it = open_iter()
        try:
            return next(it)
        except StopIteration:
            raise RuntimeError(
                f"the loader ({type(loader).__name__}) yielded no batches: nothing to profile"
            ) from None
        finally:
            runs.shutdown_iterator(it)
    finally:
        set_workers(loader, workers)

"""Orchestration of the differential runs, for a command line and for the Python API (``dsanalyzer.profile``).
Named ``profiler`` so that the module never shadows the ``dsanalyzer.profile`` function.
``profile_command(["python", "train.py", ...])`` runs the unmodified script four times under the
import hook (:mod:`dsanalyzer.intercept`), once per run of :data:`dsanalyzer.measure.plan.MODES`, each
stopped after warm-up + N iterations; ``profile(make_loader, train_step)`` does the same in this
process. Both end in :func:`assemble_report`, which turns the raw per-run results into report.json.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil

from dsanalyzer.jobs import dali_iter, prepare
from dsanalyzer.jobs.coordl_loader import fresh_iter
from dsanalyzer.measure import runs
from dsanalyzer.measure.cpu import main_process_section
from dsanalyzer.measure.hookconfig import HookConfig
from dsanalyzer.measure.launch import ProfileError, ProgressBar, run_child
from dsanalyzer.measure.machine import available_cpus, machine_section
from dsanalyzer.measure.membw import measure_memory_bandwidth
from dsanalyzer.measure.ompspin import host_omp_spin
from dsanalyzer.measure.plan import MODES, RunPlan
from dsanalyzer.measure.stalls import bound_of, differential, epoch_start, per_epoch
from dsanalyzer.measure.sysmon import SysMonitor, concat_series
from dsanalyzer.measure.timeline import Timeline, cuda_sync_or_none, summarize
from dsanalyzer.model.comm import comm_section
from dsanalyzer.report.schema import SCHEMA_VERSION, attach_model, write_report
from dsanalyzer.report.trace import write_trace

__all__ = ["ProfileError", "profile", "profile_command", "assemble_report", "default_out_dir", "run_child"]


def default_out_dir(name: str = "run") -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("reports") / "runs" / f"{stamp}-{Path(name).stem or 'run'}"


def _memory_budget() -> int:
    # A quarter of what is free: enough for the prep run's items without pushing the job into swap.
    return int(psutil.virtual_memory().available // 4)


# -- report assembly -------------------------------------------------------------------------------


def _summaries(results: dict[str, dict], warmup: int) -> dict:
    summaries = {}
    for mode in ("compute", "prep", "real"):
        r = results[mode]
        try:
            summaries[mode] = summarize(r["wait_s"], r["step_s"], r["batch_items"], warmup)
        except ValueError as e:
            raise ProfileError(f"{mode} run: {e}") from None
    return summaries


def _dataset(dataset: dict, fetch: dict) -> dict:
    if not dataset.get("avg_item_bytes") and fetch.get("items"):
        # no files to stat (an item source over something else): size items from the fetch sample
        avg = fetch["bytes"] / fetch["items"]
        dataset = {**dataset, "avg_item_bytes": avg, "bytes": int(avg * int(dataset.get("items") or 0))}
        dataset.pop("size_note", None)
        dataset["size_method"] = "bytes the fetch-rate sample read per item"
    return dataset


def _runs_section(results: dict[str, dict], summaries: dict) -> dict:
    runs = {}
    for mode, r in results.items():
        entry = {
            "iters": len(r.get("wait_s", [])),
            "status": r.get("status", "stopped"),
            "wait_s": r.get("wait_s", []),
            "step_s": r.get("step_s", []),
        }
        if mode in summaries:
            entry.update(samples_per_s=summaries[mode].samples_per_s, summary=summaries[mode].as_dict())
        runs[mode] = entry
    return runs


FETCH_KEYS = (
    "bytes_per_s",
    "items_per_s",
    "threads",
    "method",
    "error",
    "cold_read_cpu_s",
    "warm_read_cpu_s",
)


def assemble_report(
    results: dict[str, dict],
    *,
    command: list[str] | str,
    warmup: int,
    sysmon: dict,
    mem_bw: float,
    page_cache_bytes: int | None = None,
    storage_note: str | None = None,
    compute_note: str | None = None,
    omp_spin: dict | None = None,
) -> dict:
    """Combine the four runs' raw results into a report (model and what-if attached). ``page_cache_bytes``
    is the page cache the job may use (default: the memory available now); ``storage_note`` and
    ``compute_note`` label the storage and the step (the demo's emulated device and accelerator)."""
    summaries = _summaries(results, warmup)
    diff = differential(summaries["compute"], summaries["prep"], summaries["real"])
    scal_res = results["prep_scaling"]
    loader = results["real"].get("loader", {})
    batch = summaries["real"].batch_size
    workers = int(loader.get("num_workers", 0) or 0)
    scaling = scal_res.get("scaling", {"workers": [], "samples_per_s": []})
    prep_rate = summaries["prep"].samples_per_s
    for k, rate in zip(scaling.get("workers", []), scaling.get("samples_per_s", []), strict=False):
        if k == max(1, workers):
            prep_rate = rate
    fetch = scal_res.get("fetch", {})
    dataset = _dataset(scal_res.get("dataset", {}), fetch)
    n_items = int(dataset.get("items") or 0)
    cache_bytes = int(loader.get("cache_bytes") or 0)
    bucket = (scal_res.get("source") or {}).get("kind") == "bucket"
    policy = "minio" if cache_bytes > 0 or bucket else "pagecache"  # no page cache holds a bucket's objects
    if policy == "pagecache":
        if page_cache_bytes is None:
            page_cache_bytes = int(psutil.virtual_memory().available)
        cache_bytes = int(page_cache_bytes)
    per_iter = diff["per_iter_s"]
    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": [command] if isinstance(command, str) else [str(a) for a in command],
        "machine": machine_section(dataset, mem_bw, storage_note, compute_note, omp_spin),
        "dataset": dataset,
        "batch_size": int(round(batch)),
        "workers": workers,
        "loader": loader,  # as the real run saw it (a DALI iterator adds pipelines and prep_device)
        "cache_bytes": cache_bytes,
        "cache_policy": policy,
        "rates_per_s": {
            "compute": summaries["compute"].samples_per_s,
            "prep": prep_rate,
            "fetch": fetch.get("items_per_s"),
            "observed": summaries["real"].samples_per_s,
        },
        "prep_scaling": scaling,
        "main_process": main_process_section(results, warmup, workers, scaling),
        "fetch": {k: fetch.get(k) for k in FETCH_KEYS},
        **diff,
        "per_epoch_s": per_epoch(per_iter, n_items, batch, loader.get("batches_per_epoch")),
        "bound": bound_of(per_iter),
        "advice": "",
        "sysmon": sysmon,
        "model": {},
        "whatif": {"grid": [], "to_compute_bound": {}},
        "warmup_iters": warmup,
        "source": scal_res.get("source") or {"kind": "files" if dataset.get("path") else "unknown"},
        "prep_memory": results["prep"].get("memory", {}),
        "remedy_probes": scal_res.get("remedy_probes") or {},  # coordinate=, sample_cache=
        "real_cold": results["real"].get("cold", {}),
        **{k: scal_res[k] for k in ("peer", "gpu_prep", "prep_spread") if k in scal_res},  # the probes
    }
    real = results["real"]
    start = epoch_start(real.get("wait_s", []), real.get("epoch_starts") or [], warmup, workers)
    if start is not None:
        report["epoch_start"] = start
    report["runs"] = _runs_section(results, summaries)
    comm = comm_section(results, warmup)
    if comm is not None:
        report["comm"] = comm
    return attach_model(report)


# -- the command-line path ---------------------------------------------------------------------------


def profile_command(
    command: list[str],
    out_dir: str | os.PathLike | None = None,
    iters: int = 100,
    warmup: int = 5,
    data_path: str | None = None,
    timeout_s: float = 600.0,
    show_progress: bool = True,
    page_cache_bytes: int | None = None,
    storage_note: str | None = None,
    min_seconds: float = 0.0,
    compute_note: str | None = None,
    trace: bool = False,
) -> dict:
    """Profile an unmodified training command; writes report.json/html into ``out_dir``; returns the report.

    ``page_cache_bytes``: the page cache the job may use (a shared server's limit; default: the memory
    available now); ``storage_note``, ``compute_note``: labels for the storage and the training
    step, shown in the report; ``min_seconds``:
    each run measures for at least this long, past ``iters`` if need be (a fast run of 60 iterations
    lasts 2 s, short enough for a noisy machine to move it by 20%); ``trace``: also write
    ``trace.json``, the real run's timeline (:mod:`dsanalyzer.report.trace`).
    """
    if not command:
        raise ProfileError(
            "no command to profile: put it after `--`, e.g. dsanalyzer profile -- python train.py"
        )
    script = next((a for a in command[1:] if a.endswith(".py")), command[0])
    out = Path(out_dir) if out_dir else default_out_dir(script)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    workers_list = tuple(range(1, available_cpus() + 1))
    budget = _memory_budget()
    results: dict[str, dict] = {}
    series = []
    for mode in MODES:
        cfg = HookConfig(
            mode, iters, warmup, workers_list, data_path, budget,
            result_dir=str(out / "logs" / mode), min_seconds=min_seconds,
        )  # fmt: skip
        bar = ProgressBar(f"{mode:>12}", show_progress)
        with SysMonitor() as mon:
            try:
                results[mode] = run_child(command, cfg, out / "logs" / f"{mode}.log", timeout_s, bar.update)
            finally:
                bar.close()
        series.append({**mon.series(), "run": mode})
        if results[mode].get("status") == "exit" and mode != "prep_scaling":
            print(
                f"dsanalyzer: the {mode} run ended by itself after {len(results[mode]['wait_s'])} of "
                f"{warmup + iters} iterations (fewer measured iterations than asked)",
                file=sys.stderr,
            )
    mem_bw = measure_memory_bandwidth()
    report = assemble_report(
        results,
        command=command,
        warmup=warmup,
        sysmon=_join(series),
        mem_bw=mem_bw,
        omp_spin=host_omp_spin(),
        page_cache_bytes=page_cache_bytes,
        storage_note=storage_note,
        compute_note=compute_note,
    )
    write_report(report, out)
    if trace:  # the real run's per-iteration timeline, one track per rank and per loader worker
        write_trace(results, report, out)
    report["_out_dir"] = str(out)
    return report


def _join(series: list[dict]) -> dict:
    joined = concat_series(series)
    joined["runs"] = [{"run": s["run"], "samples": len(s["t_s"])} for s in series]
    return joined


# -- the Python API ----------------------------------------------------------------------------------


def _fresh_iter(loader: Any) -> Callable[[], Any]:
    """A new iterator per call (:func:`dsanalyzer.jobs.coordl_loader.fresh_iter`)."""
    return fresh_iter(loader, lambda: iter(loader)) or (lambda: iter(loader))


def _open_iter(loader: Any) -> Callable[[], Any]:
    """The loader's iterator for the next epoch, as a training loop gets it."""
    if dali_iter.is_dali_iterator(loader):  # its own iterator: reset only after a consumed epoch
        return lambda: dali_iter.restart(loader)
    return lambda: iter(loader)


def _close(loader: Any) -> None:
    """Stop the loader's workers (or DALI's pipelines) now: each run gets a fresh loader."""
    if dali_iter.is_dali_iterator(loader):
        dali_iter.close(loader)
        return
    close = getattr(loader, "close", None)
    if callable(close):
        close()


def _drive(open_iter: Callable[[], Any], train_step: Callable[[Any], Any], n: int) -> dict:
    """Run ``n`` iterations of the loop, timed at the iterator boundary; epochs restart as needed."""
    timeline = Timeline(sync=cuda_sync_or_none())
    timeline.iterator_opened(time.perf_counter())
    it = open_iter()
    try:
        for _ in range(n):
            timeline.next_started()
            try:
                batch = next(it)
            except StopIteration:  # the wait goes on: ending the epoch and starting the next are the loader's
                runs.shutdown_iterator(it)
                timeline.iterator_opened(time.perf_counter())
                it = open_iter()
                batch = next(it, None)
                if batch is None:
                    break
            timeline.next_ended(runs.batch_items(batch))
            train_step(batch)
        timeline.next_started()  # closes the last step
    finally:
        runs.shutdown_iterator(it)
    return {
        "wait_s": timeline.wait_s,
        "step_s": timeline.step_s,
        "batch_items": timeline.batch_items,
        "wait_cpu_s": timeline.wait_cpu_s,
        "step_cpu_s": timeline.step_cpu_s,
        "starts_s": timeline.starts,
        "epoch_starts": timeline.epoch_starts,
    }


def profile(
    make_loader: Callable[[], Any],
    train_step: Callable[[Any], Any],
    iters: int = 100,
    warmup: int = 5,
    out: str | os.PathLike | None = None,
    data_path: str | None = None,
    workers_list: list[int] | None = None,
) -> dict:
    """Profile a training loop in this process: the same four runs as ``dsanalyzer profile``.

    Args:
        make_loader: returns a fresh loader (torch or coordl DataLoader, coordl.dali.DALILoader, or a
            DALI iterator such as ``DALIGenericIterator``); called once per run.
        train_step: does one training step on a batch.
        iters: measured iterations per run (after ``warmup`` dropped ones).
        out: directory for report.json and report.html (nothing written when None).
        data_path: the dataset's files, when the loader's dataset does not list them.
        workers_list: worker counts for the prep-scaling run (default 1..available cores).

    Returns:
        The report as a dict (the report.json layout).
    """
    n = warmup + iters
    ks = tuple(workers_list or range(1, available_cpus() + 1))
    results: dict[str, dict] = {}
    series = []
    for mode in MODES:
        plan = RunPlan(mode, iters, warmup, ks, data_path, _memory_budget())
        loader = make_loader()
        open_iter = _open_iter(loader)
        with SysMonitor() as mon:
            prepared = prepare(plan, loader, open_iter, _fresh_iter(loader))
            try:
                info = prepared.info
                if mode == "compute":

                    def replay(r: Any = prepared.replay) -> Any:  # every epoch replays the same batches
                        return r

                    info.update(_drive(replay, train_step, n))
                elif mode != "prep_scaling":
                    info.update(_drive(open_iter, train_step, n))
            finally:
                prepared.undo()  # make_loader may hand the same dataset to the next run
        series.append({**mon.series(), "run": mode})
        results[mode] = info
        _close(loader)
    report = assemble_report(
        results,
        command="dsanalyzer.profile()",
        warmup=warmup,
        sysmon=_join(series),
        mem_bw=measure_memory_bandwidth(),
        omp_spin=host_omp_spin(),
    )
    if out is not None:
        write_report(report, out)
    return report

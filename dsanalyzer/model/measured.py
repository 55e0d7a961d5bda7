"""The what-if model's parameters, read from a report's measured fields (a dict: no file is opened here).

Every field the model needs is checked where it is read: a missing one, or one that is not a positive
finite number, is a ``ValueError`` that names the field (``dataset.avg_item_bytes``, ``fetch.bytes_per_s``),
so a report from a job that could not measure it says so instead of predicting from a guess.
"""

from __future__ import annotations

import math
from typing import Any

from dsanalyzer.model.cache import POLICIES
from dsanalyzer.model.scaling import PrepScaling
from dsanalyzer.model.store import store_fields

__all__ = ["field", "positive", "main_process_costs", "remedy_fields", "probe_fields", "model_fields"]


def field(report: dict, *keys: str, required: bool = True, default: Any = None) -> Any:
    """``report[k1][k2]...``; a missing (or null) field is an error naming it, or ``default`` when optional."""
    node = report
    for key in keys:
        if not isinstance(node, dict) or key not in node or node[key] is None:
            if required:
                raise ValueError(
                    f"report.json: missing field {'.'.join(keys)!r}, which the what-if model needs"
                )
            return default
        node = node[key]
    return node


def positive(value: Any, name: str) -> float:
    """``value`` as a positive finite float, or an error naming the field."""
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"report.json: {name} must be a positive number, got {value}")
    return value


def _number(value: Any) -> float | None:
    """``value`` as a finite non-negative float, None when absent or not one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if value >= 0 and math.isfinite(value) else None


def _run_samples(report: dict, key: str, run: str) -> list | None:
    """The system monitor's ``key`` samples taken during ``run`` (``sysmon.runs``; None when not recorded)."""
    mon = report.get("sysmon") or {}
    series = mon.get(key)
    if not series:
        return None
    start = 0
    for part in mon.get("runs") or []:
        if part.get("run") == run:
            return series[start : start + int(part["samples"])]
        start += int(part.get("samples") or 0)
    return None


def other_cpu_cores(report: dict, run: str = "real") -> float | None:
    """Mean cores used by processes outside the job during ``run`` (``sysmon.runs``; None when not recorded)."""
    values = [v for v in _run_samples(report, "other_cpu_cores", run) or [] if v is not None]
    return sum(values) / len(values) if values else None


def host_idle_cores(report: dict, run: str = "real") -> float | None:
    """Mean cores the host left idle during ``run``, whoever used the rest: over the real run's measured
    batches (``main_process.job_idle_cores``), else over the whole run (``sysmon``'s per-core utilisation,
    which holds the process's start too); None when not recorded."""
    mp = report.get("main_process") or {}
    if run == "real" and mp.get("job_cpu_run") == "real" and mp.get("job_idle_cores") is not None:
        return float(mp["job_idle_cores"])
    return idle_cores(_run_samples(report, "cpu_percent_per_core", run) or [])


def idle_cores(cpu_percent_per_core: list[list[float]]) -> float | None:
    """Mean cores left idle over samples of each core's use in percent (None: no sample)."""
    rows = [r for r in cpu_percent_per_core if r]
    if not rows:
        return None
    return sum(sum(1.0 - min(p, 100.0) / 100.0 for p in r) for r in rows) / len(rows)


def main_process_costs(report: dict, cpus: int) -> dict:
    """The CPU the job's processes spend, per batch and per sample, and the share of its cores it got.

    * ``batch_overhead_s``: the main thread's own CPU per batch inside ``__next__`` (receiving,
      unpickling, collating), from the in-memory run (``main_process.receive_cpu_s_per_batch``). It is
      CPU time, so neither waiting for workers nor losing the core to them counts in it.
    * ``step_cpu_s``: the main process's CPU per step (``main_process.step_cpu_s_per_batch``, the compute run).
    * ``prep_cpu_s``: CPU per sample of the data path, workers and main process together, from the
      loader-alone run at the most workers measured within the cores (``prep_scaling.cpu_s_per_sample``).
    * ``cpu_share``: the job's CPU over wall time x cores in that run (below 1: other processes held
      some of the cores, or torch's pipeline left its workers idle between batches), so that CPU
      seconds become wall seconds as this machine gave them; the real run's (``main_process.job_cpu_share``)
      where it got more.
    * ``free_share``: the share other processes left (``1 - other_cores / cpus`` in the prep-scaling run,
      the system monitor's): what a pipeline without torch's gaps (coordinated prep's producers) gets.

    * ``job_cpu_s``: the real run's CPU per sample, main process and workers together as they ran
      side by side, reads included (``main_process.job_cpu_s_per_sample``); the model prefers it
      (the in-memory run's, ``in_memory_cpu_s``, with a MinIO cache or a bucket).
    * ``torch_threads``, ``threads_follow_cores``, ``step_on_cpu``: what decides how many cores torch's
      idle intra-op threads hold on more cores (:mod:`~dsanalyzer.model.cores`); ``omp_spin_s`` (the
      host's spin after a region, ``machine.omp_spin_s``) and ``main_preempts_per_batch`` (the real
      run's) how long they hold them.

    A report without them (an older dsanalyzer, a hand-written report) gets 0 / None: then the model
    has no per-batch cost and no shared-core limit, as before these were measured.
    """
    mp = field(report, "main_process", required=False) or {}
    out: dict = {
        "batch_overhead_s": _number(mp.get("receive_cpu_s_per_batch")) or 0.0,
        "step_cpu_s": _number(mp.get("step_cpu_s_per_batch")),
        "prep_cpu_s": None,
        "cpu_share": 1.0,
        "job_cpu_s": _number(mp.get("job_cpu_s_per_sample")) or None,
        "in_memory_cpu_s": _number(mp.get("in_memory_job_cpu_s_per_sample")) or None,
        "torch_threads": int(mp["torch_threads"]) if _number(mp.get("torch_threads")) else None,
        "cpu_threads": int(mp["torch_threads"]) if _number(mp.get("torch_threads")) else None,
        "threads_follow_cores": bool(mp.get("threads_follow_cores")),
        "step_on_cpu": mp.get("step_device", "cpu") == "cpu",
        "omp_spin_s": _number((report.get("machine") or {}).get("omp_spin_s")),
        "free_share": None,
        "main_preempts_per_batch": _number(mp.get("job_main_preempts_per_batch")),
    }
    scaling = field(report, "prep_scaling", required=False) or {}
    ks = scaling.get("workers") or []
    per_sample = scaling.get("cpu_s_per_sample") or []
    shares = scaling.get("cpu_share") or []
    cores = int(scaling.get("cores") or cpus)
    best = None
    for i, k in enumerate(ks):
        if i < len(per_sample) and _number(per_sample[i]) and k <= cores and (best is None or k > ks[best]):
            best = i
    if best is not None:
        out["prep_cpu_s"] = float(per_sample[best])
        share = _number(shares[best]) if best < len(shares) else None
        if share and ks[best] >= cores:  # saturating: every core had a worker or the main process on it
            # Both runs' shares are what the job got at least: the loader alone's also holds its own
            # pipeline's gaps (0.92 on a quiet 2-core VM where the real run of the job got 0.97)
            real = _number(mp.get("job_cpu_share")) if mp.get("job_cpu_run") == "real" else None
            out["cpu_share"] = min(1.0, max(0.05, share, real or 0.0))
    others = other_cpu_cores(report, "prep_scaling")
    if others is not None and cpus > 0:
        out["free_share"] = min(1.0, max(0.05, 1.0 - others / cpus))
    return out


_OLD = "the report has no remedy_probes (profiled before dsanalyzer measured them): profile again"


def remedy_fields(report: dict) -> dict:
    """What the prep-scaling run's probes measured for coordinated prep and the sample cache
    (``remedy_probes``, :mod:`dsanalyzer.measure.remedy_probes`); a remedy not measured keeps None and
    the reason (``*_why``), so that its what-if says why instead of guessing."""
    probes = field(report, "remedy_probes", required=False) or {}
    coord = probes.get("coordinate") or {"not_measured": _OLD}
    cache = probes.get("sample_cache") or {"not_measured": _OLD}
    out: dict = {
        "shared_batch_bytes": _number(coord.get("batch_bytes")) or None,
        "shared_receive_s": _number(coord.get("receive_cpu_s_per_batch")),
        "det_cpu_s": _number(cache.get("det_cpu_s_per_sample")),
        "random_cpu_s": _number(cache.get("random_cpu_s_per_sample")),
        "cached_sample_bytes": _number(cache.get("cached_sample_bytes")) or None,
        "cache_read_s": _number(cache.get("read_cpu_s_per_sample")),
    }
    out["coordinate_why"] = "" if out["shared_batch_bytes"] else str(coord.get("not_measured") or _OLD)
    complete = out["det_cpu_s"] is not None and out["cached_sample_bytes"] and out["cache_read_s"] is not None
    out["sample_cache_why"] = "" if complete else str(cache.get("not_measured") or _OLD)
    return out


def probe_fields(report: dict) -> dict:
    """What the remedies' probes measured (``peer``: a remote hit on loopback Redis; ``gpu_prep``: decode and
    augment on the GPU), as :class:`~dsanalyzer.model.params.JobParams` fields; absent ones stay unknown.

    A report without them (older, or a probe that could not run) loads as before: the partitioned what-if
    then charges a remote hit its bytes over the link alone, and GPU prep is unknown, with the probe's
    reason (``gpu_prep.why``) when it recorded one.
    """
    peer = field(report, "peer", required=False) or {}
    gpu = field(report, "gpu_prep", required=False) or {}
    rate = _number(gpu.get("samples_per_s")) or None
    why = str(gpu.get("why") or "") if not rate else ""
    return {
        "peer_item_s": _number(peer.get("item_s")),
        "peer_batch_s": _number(peer.get("batch_s")),
        "gpu_prep_per_s": rate,
        "gpu_prep_cpu_s": _number(gpu.get("cpu_s_per_sample")) if rate else None,
        "gpu_prep_size": int(gpu["size"]) if rate and _number(gpu.get("size")) else None,
        "gpu_prep_why": why or ("" if rate else "the profile did not probe GPU prep (an older dsanalyzer)"),
    }


def _item_bytes(report: dict, items: int) -> float:
    """The mean item size: measured, else the dataset's bytes over its items; unknown is an error."""
    avg = field(report, "dataset", "avg_item_bytes", required=False)
    if not avg and not field(report, "dataset", "bytes", required=False):
        note = field(report, "dataset", "size_note", required=False, default=None)
        raise ValueError(f"report.json: the dataset's item size is unknown: {note or 'give --data DIR'}")
    if avg is None:
        avg = positive(field(report, "dataset", "bytes"), "dataset.bytes") / max(1, items)
    return positive(avg, "dataset.avg_item_bytes")


def _prep_points(report: dict) -> tuple[list, list]:
    """The measured (workers, samples/s) of the prep-scaling run; the prep rate at the run's workers without one."""
    scaling = field(report, "prep_scaling", required=False) or {}
    ks, rates = scaling.get("workers") or [], scaling.get("samples_per_s") or []
    if not ks:  # a single measured point: the prep rate at the run's worker count
        ks = [max(1, int(field(report, "workers", required=False, default=1)))]
        rates = [positive(field(report, "rates_per_s", "prep"), "rates_per_s.prep")]
    return list(ks), list(rates)


def _real_read_hit_ratio(report: dict, epoch_items: int, batch: int) -> float | None:
    """The share of the real run's measured reads that found their item cached: it began with the dataset
    evicted (``real_cold``), so only what stayed resident and what it read a second time (past one epoch)
    was. None when it did not begin cold (nothing evicted) or its length is not in the report."""
    cold = report.get("real_cold") or {}
    resident = _number(cold.get("resident_fraction_after"))
    iters = _number(field(report, "runs", "real", "iters", required=False))
    warmup = _number(report.get("warmup_iters")) or 0.0
    if not cold.get("evicted") or resident is None or not iters or iters <= warmup or epoch_items <= 0:
        return None
    first, last = warmup * batch, iters * batch  # the samples the CPU was measured over
    again = max(0.0, last - max(first, float(epoch_items))) / (last - first)
    return min(1.0, resident + (1.0 - resident) * again)


def _epoch_items(report: dict, items: int, batch: int) -> int | None:
    """Samples this process reads per epoch: ``len(loader)`` batches (under a DistributedSampler each
    rank's share) when the loader knew it, at most the dataset; None: the whole dataset."""
    batches = field(report, "loader", "batches_per_epoch", required=False)
    if not isinstance(batches, int) or batches <= 0:
        return None
    return min(items, batches * batch) if items else batches * batch


def model_fields(report: dict) -> dict:
    """Keyword arguments of :class:`~dsanalyzer.model.whatif.Model`, from a report.json's measured fields."""
    cpus = int(field(report, "machine", "cpus"))
    items = int(field(report, "dataset", "items"))
    ks, rates = _prep_points(report)
    if field(report, "dataset", "reads_no_files", required=False):
        # nothing to read (tensors in memory, generated samples): fetch is free, prep and step are left
        avg, storage_bw, overhead = 0.0, math.inf, 0.0
    else:
        avg = _item_bytes(report, items)
        storage_bw = positive(field(report, "fetch", "bytes_per_s"), "fetch.bytes_per_s")
        items_per_s = field(report, "fetch", "items_per_s", required=False)
        # per-item cost beyond bandwidth (open, request latency): what items/s shows that bytes/s does not
        overhead = 0.0 if not items_per_s else max(0.0, 1.0 / float(items_per_s) - avg / storage_bw)
    store = store_fields(report)  # a bucket: its fitted rates replace the one bytes/s of a disk
    if store:
        storage_bw, overhead = store["store"].bandwidth_bytes_per_s, 0.0
    membw = field(report, "machine", "mem_bandwidth_bytes_per_s", required=False)
    policy = field(report, "cache_policy", required=False, default="pagecache")
    if policy not in POLICIES:
        raise ValueError(f"report.json: cache_policy {policy!r} is not one of {', '.join(POLICIES)}")
    workers = max(0, int(field(report, "workers", required=False, default=cpus)))
    batch = int(field(report, "batch_size"))
    compute = positive(field(report, "rates_per_s", "compute"), "rates_per_s.compute")
    prep = PrepScaling.fit(ks, rates, physical_cores=cpus)
    start = _number(field(report, "epoch_start", "s_per_epoch", required=False))
    start_round = _number(field(report, "epoch_start", "first_round", required=False))
    epoch_items = _epoch_items(report, items, batch)
    return {
        "dataset_items": items,
        "epoch_items": epoch_items,
        "epoch_start_s": start or 0.0,
        "epoch_start_round": max(1, int(start_round or 1)),
        "warm_read_cpu_s": _number(field(report, "fetch", "warm_read_cpu_s", required=False)),
        "real_read_hit_ratio": _real_read_hit_ratio(report, epoch_items or items, batch),
        "avg_item_bytes": avg,
        "batch_size": batch,
        "compute_per_s": compute,
        "prep": prep,
        "storage_bytes_per_s": storage_bw,
        "storage_overhead_s": overhead,
        "mem_bandwidth_bytes_per_s": float(membw) if membw else None,
        "cpus": cpus,
        "workers": workers,
        "cache_bytes": float(field(report, "cache_bytes", required=False, default=0.0)),
        "cache_policy": policy,
        "prep_points": tuple((int(k), float(r)) for k, r in zip(ks, rates, strict=True)),
        "remote_wire_bytes": _number(field(report, "loader", "remote_wire_bytes", required=False)),
        **main_process_costs(report, cpus),
        **remedy_fields(report),
        **probe_fields(report),
        **store,
    }

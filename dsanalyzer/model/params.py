"""One job's measured parameters (:class:`JobParams`), the numbers every what-if prediction starts from.

A frozen dataclass of plain numbers, filled from a report by :func:`~dsanalyzer.model.measured.model_fields`;
:class:`~dsanalyzer.model.whatif.Model` adds the predictions to it, and each stage's rate is a pure
function of it (:mod:`~dsanalyzer.model.stages`, :mod:`~dsanalyzer.model.cores`,
:mod:`~dsanalyzer.model.epoch_start`). A new remedy's measurement becomes one more field here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsanalyzer.model.scaling import PrepScaling
from dsanalyzer.model.store import StoreModel

__all__ = ["JobParams", "params_json"]


@dataclass(frozen=True)
class JobParams:
    """Measured parameters of one job, at the operating point it was profiled at (``measured_at``)."""

    dataset_items: int
    avg_item_bytes: float
    batch_size: int
    compute_per_s: float
    prep: PrepScaling
    storage_bytes_per_s: float
    storage_overhead_s: float = 0.0
    mem_bandwidth_bytes_per_s: float | None = None
    cpus: int = 1
    workers: int = 1
    cache_bytes: float = 0.0
    cache_policy: str = "pagecache"
    prep_points: tuple = ()  # the measured (workers, samples/s) pairs the prep curve was fitted to
    batch_overhead_s: float = (
        0.0  # the main thread's own CPU per batch receiving it (in series with the step)
    )
    step_cpu_s: float | None = None  # the main process's CPU per step (None: not measured)
    prep_cpu_s: float | None = None  # CPU per sample of the data path, all processes (None: not measured)
    cpu_share: float = 1.0  # the share of its cores the job got while profiled
    free_share: float | None = None  # the share other processes left it (None: not monitored)
    job_cpu_s: float | None = None  # CPU per sample of the whole job as it ran (the real run), all processes
    in_memory_cpu_s: float | None = None  # the same in the in-memory run (no item read)
    torch_threads: int | None = None  # torch's intra-op threads in the main process while profiled
    # the threads job_cpu_s and in_memory_cpu_s were measured with (None: torch_threads): a remedy's what-if
    # replaces torch_threads, and the CPU measured with spinning helpers is no 1-thread job's CPU
    cpu_threads: int | None = None
    threads_follow_cores: bool = False  # torch's default: as many intra-op threads as cores
    step_on_cpu: bool = True  # the step runs on the CPU (its intra-op threads spin between regions)
    omp_spin_s: float | None = (
        None  # CPU an idle intra-op thread spins after a region here (None: throughout)
    )
    main_preempts_per_batch: float | None = (
        None  # the main thread's involuntary switches per batch (real run)
    )
    epoch_items: int | None = None  # samples one process reads per epoch (a DistributedSampler's share)
    epoch_start_s: float = (
        0.0  # what starting an epoch costs beyond steady batches (measured in the real run)
    )
    epoch_start_round: int = 1  # batches the measured start counted as its first round (1: old reports)
    warm_read_cpu_s: float | None = None  # CPU of reading an item again from the page cache (fetch probe)
    real_read_hit_ratio: float | None = (
        None  # the real run's reads of items already cached (it began evicted)
    )
    store: StoreModel | None = None  # an object store's fitted rates (None: files; see model/store.py)
    fetch_ahead: int = 0  # read-ahead threads per worker (coordl's fetch_ahead): the store's concurrency
    items_per_request: float = 1.0  # items one store request brings (a shard's items; 1 for loose files)
    remote_wire_bytes: float | None = None  # one sample's bytes back from a remote CPU (None: not measured)
    # coordinated prep (--jobs; model/coordinate.py): one prepped batch as the group's ring holds it
    shared_batch_bytes: float | None = None  # bytes of one encoded batch (None: not measured)
    shared_receive_s: float | None = None  # a job's CPU per batch decoding it out of shared memory
    coordinate_why: str = ""  # why the two above were not measured
    # the sample cache (--sample-cache-gb; model/sample_cache.py): the split of prep, per sample
    det_cpu_s: float | None = None  # CPU of the deterministic prefix (what a hit saves)
    random_cpu_s: float | None = None  # CPU of the random tail (what runs every epoch anyway)
    cached_sample_bytes: float | None = (
        None  # store bytes one cached sample takes (index and header included)
    )
    cache_read_s: float | None = None  # CPU per sample reading it back from the store
    sample_cache_why: str = ""  # why the four above were not measured
    # the partitioned cache's remote hit, probed on loopback Redis (None: not probed; see model/partitioned.py)
    peer_item_s: float | None = None  # a remote item's own cost beyond the link (client and server copies)
    peer_batch_s: float | None = None  # one MGET round trip's fixed cost (a batch's, not an item's)
    # GPU prep probed on the job's own items (None: not measured, gpu_prep_why says why; model/gpu_prep.py)
    gpu_prep_per_s: float | None = None  # samples/s of decode + augment on the GPU
    gpu_prep_cpu_s: float | None = None  # host CPU per sample that GPU prep still costs (feeding, launching)
    gpu_prep_why: str = ""
    gpu_prep_size: int | None = (
        None  # the side of the job's samples the probe cropped to (DALI's pipeline size)
    )

    @property
    def fetch_free(self) -> bool:
        """True for a dataset that reads no files: nothing to fetch, no cache or storage axis."""
        return self.avg_item_bytes == 0 and not math.isfinite(self.storage_bytes_per_s)

    @property
    def dataset_bytes(self) -> float:
        return self.dataset_items * self.avg_item_bytes


def params_json(job: JobParams) -> dict:
    """JSON-ready parameters (what report.json stores under ``model``, after the formula)."""
    return {
        "dataset_items": job.dataset_items,
        "epoch_items": job.epoch_items,
        "epoch_start_s": job.epoch_start_s,
        "epoch_start_round": job.epoch_start_round,
        "warm_read_cpu_s": job.warm_read_cpu_s,
        "real_read_hit_ratio": job.real_read_hit_ratio,
        "avg_item_bytes": job.avg_item_bytes,
        "batch_size": job.batch_size,
        "compute_samples_per_s": job.compute_per_s,
        "prep_scaling": job.prep.params(),
        "storage_bytes_per_s": _finite(job.storage_bytes_per_s),  # None: the dataset reads no files
        "fetch_free": job.fetch_free,
        "storage_overhead_s": job.storage_overhead_s,
        "batch_overhead_s": job.batch_overhead_s,
        "step_cpu_s": job.step_cpu_s,
        "prep_cpu_s": job.prep_cpu_s,
        "cpu_share": job.cpu_share,
        "free_share": job.free_share,
        "job_cpu_s": job.job_cpu_s,
        "in_memory_cpu_s": job.in_memory_cpu_s,
        "torch_threads": job.torch_threads,
        "cpu_threads": job.cpu_threads,
        "threads_follow_cores": job.threads_follow_cores,
        "omp_spin_s": job.omp_spin_s,
        "main_preempts_per_batch": job.main_preempts_per_batch,
        "step_on_cpu": job.step_on_cpu,
        "mem_bandwidth_bytes_per_s": job.mem_bandwidth_bytes_per_s,
        "store": None if job.store is None else job.store.params(),
        "fetch_ahead": job.fetch_ahead,
        "items_per_request": job.items_per_request,
        "remote_wire_bytes": job.remote_wire_bytes,
        "coordinate": {
            "shared_batch_bytes": job.shared_batch_bytes,
            "shared_receive_s": job.shared_receive_s,
            "why_not_measured": job.coordinate_why,
        },  # fmt: skip
        "sample_cache": {
            "det_cpu_s": job.det_cpu_s,
            "random_cpu_s": job.random_cpu_s,
            "cached_sample_bytes": job.cached_sample_bytes,
            "cache_read_s": job.cache_read_s,
            "why_not_measured": job.sample_cache_why,
        },  # fmt: skip
        "peer_item_s": job.peer_item_s,
        "peer_batch_s": job.peer_batch_s,
        "gpu_prep_per_s": job.gpu_prep_per_s,
        "gpu_prep_cpu_s": job.gpu_prep_cpu_s,
        "gpu_prep_why": job.gpu_prep_why,
        "gpu_prep_size": job.gpu_prep_size,
        "measured_at": {
            "cpus": job.cpus,
            "workers": job.workers,
            "cache_bytes": job.cache_bytes,
            "cache_policy": job.cache_policy,
        },
    }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None

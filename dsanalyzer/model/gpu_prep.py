"""GPU prep (decode and augment on the GPU: ``coordl.dali.DALILoader(device="gpu")``): the job's samples/s.

With prep on the GPU the CPU workers' prep stage is gone; what is left (a pipeline's stages, the slowest
one binds)::

    rate = min(1 / (1/compute + 1/R_gpu),     the GPU: the step, then the prep of the next batch
               F(h, storage),                 fetch: as for the CPU loader at this cache and storage
               a c / (cpu_gpu + step_cpu/B))  the cores: what feeding the GPU still costs the CPU

* ``R_gpu`` is what the profile's probe measured (:mod:`dsanalyzer.measure.gpu_prep`): decode + random
  crop + flip of a few hundred of the job's own items on the GPU, samples/s, with the host CPU per sample
  it spent (``cpu_gpu``: reading the items into tensors, launching the kernels). **The GPU step shares
  the GPU**: the model charges the GPU the step and the prep one after the other, which is what a GPU
  whose kernels already fill it does (DALI's stream overlaps the step only where the step leaves the
  GPU idle); so GPU prep never reaches the step's own rate, and is worth it where CPU prep is far slower.
* ``compute`` is the step with the main process's per-batch cost (:func:`~dsanalyzer.model.stages.compute_rate`);
  ``F`` the fetch stage of :func:`~dsanalyzer.model.stages.fetch_costs` (DALI's fetch threads overlap the
  reads' latencies, so bandwidth alone); ``a c`` the cores the job gets (``cpu_share`` x cores).

Without a probe measurement (no GPU, no GPU decoder, or an older report) the rate is unknown:
:func:`predict_gpu_prep` returns None and :func:`gpu_prep_remedy` a Remedy whose ``samples_per_s`` is
None with ``why_unknown``. The epoch start is not charged (DALI's pipeline starts once).
"""

from __future__ import annotations

import math

from dsanalyzer.model import stages
from dsanalyzer.model.params import JobParams
from dsanalyzer.model.rates import TOL, Prediction
from dsanalyzer.model.remedy import Remedy

__all__ = ["predict_gpu_prep", "gpu_prep_remedy", "unknown_reason"]


def unknown_reason(job: JobParams) -> str:
    """Why GPU prep cannot be predicted from this profile ("" when it can)."""
    if job.gpu_prep_per_s:
        return ""
    return f"unknown without a GPU: {job.gpu_prep_why or 'the profile did not measure GPU prep'}"


def predict_gpu_prep(job: JobParams, point: stages.Point) -> Prediction | None:
    """Samples/s with decode and augment on the GPU at ``point`` (None: no GPU prep rate was measured)."""
    if not job.gpu_prep_per_s:
        return None
    g, b = point.gpu_speedup, job.batch_size
    h = stages.cache_hit_ratio(job, point.policy, point.cache_bytes)
    fetch_s = stages.fetch_costs(job, point, h).aggregate_s(h)
    fetch = math.inf if fetch_s <= 0 else 1.0 / fetch_s
    step = stages.compute_rate(job, g)
    gpu = 1.0 / (1.0 / step + 1.0 / job.gpu_prep_per_s)
    cpu_s = (job.gpu_prep_cpu_s or 0.0) + (job.step_cpu_s or 0.0) / (g * b)
    cpu = job.cpu_share * point.cpus / cpu_s if cpu_s > 0 else math.inf
    rate = min(gpu, fetch, cpu)
    no_fetch = min(gpu, cpu)
    if rate >= gpu * (1 - TOL):
        bound = "compute"  # the GPU, busy with the step and the prep
    elif rate >= no_fetch * (1 - TOL):
        bound = "prep"  # the cores feeding the GPU
    else:
        bound = "fetch"
    per_iter = {
        "compute": b / (job.compute_per_s * g),
        "prep_stall": max(0.0, b / no_fetch - b / (job.compute_per_s * g)),
        "fetch_stall": max(0.0, b / rate - b / no_fetch),
    }
    stage_rates = {"compute": step, "gpu": gpu, "gpu_prep": job.gpu_prep_per_s, "fetch": fetch, "cpu": cpu}
    epoch = job.epoch_items or job.dataset_items
    return Prediction(rate, epoch / rate, bound, stage_rates, h, per_iter)


def gpu_prep_remedy(job: JobParams, point: stages.Point | None = None) -> Remedy:
    """GPU prep as a :class:`~dsanalyzer.model.remedy.Remedy` (at the profiled point when ``point`` is None)."""
    if point is None:
        point = stages.Point(job.cache_bytes, job.cpus, job.storage_bytes_per_s, policy=job.cache_policy,
                             workers=job.workers)  # fmt: skip
    size = job.gpu_prep_size or "SIZE"
    args: dict = {"loader": "coordl.dali.DALILoader", "device": "'gpu'",  # source text, as every value
            "transform": f"coordl.dali.train_pipeline({size})"}  # fmt: skip
    if point.cache_bytes > 0 and point.policy == "minio":
        args["cache_bytes"] = int(point.cache_bytes)
    pred = predict_gpu_prep(job, point)
    if pred is None or not job.gpu_prep_per_s:
        return Remedy("gpu_prep", None, loader_args=args, why_unknown=unknown_reason(job))
    share = pred.samples_per_s / job.gpu_prep_per_s  # of the GPU's time, spent on prep
    return Remedy(
        name="gpu_prep",
        samples_per_s=pred.samples_per_s,
        bound=pred.bound,
        # the job's own GPU, no new one: the share of its time prep takes (and the cache's memory, if any)
        cost={
            "gpu_prep_share": share,
            **({"memory_bytes": float(args["cache_bytes"])} if "cache_bytes" in args else {}),
        },
        loader_args=args,
        note=(
            f"decode + augment on the job's own GPU at {job.gpu_prep_per_s:.0f} samples/s (probed); the step "
            f"shares the GPU, {share:.0%} of its time goes to prep"
        ),
    )

"""What N remote CPUs add to a job (coordl's ``remote_prep=``, prep on a Ray cluster's CPUs).

A remote CPU does a local worker's work on a core of its own: ``c_w`` CPU seconds a sample, the
profile's loader-alone CPU per sample less the main process's receive (``prep_cpu_s - batch_overhead_s /
B``; ``1 / P(1)`` where not measured). Not ``1 / P(1)`` itself: the worker measured for ``P(1)`` shares
its core with the main process, which the remote CPU does not (2-core Intel VM, 2026-11-28: ``P(1)`` 823
samples/s, ``c_w`` 1.09 ms, the actor's prep alone on the other core 1.04 ms). It sends back what it
made: ``wire_bytes`` per sample (the uint8 crop when the recipe ends in ToTensor + Normalize, which then
run in the trainer: :mod:`coordl.remote.compact`), plus the raw bytes the trainer ships when the remote
nodes cannot read the dataset. Sending costs its node ``s_r = SEND_S_PER_BYTE * wire_bytes`` a sample
(Ray's task, the result into the node's object store, the push to the trainer's). So the remote side
gives

    X_r = min(N / (c_w + s_r), link / (wire_bytes + shipped_bytes))

and costs the trainer's cores ``u_r`` per remote sample: receiving it (Ray's transfer into the node's
object store and out of it), finishing it (the tail's float output, 4x the wire bytes) and handing it
out, ``RECEIVE_S_PER_BYTE`` per wire byte (measured on two hosts), plus the step's own CPU per sample. The trainer's cores first spend what the local job leaves idle; beyond that every
core-second spent on a remote sample is one the local workers lose:

    X_local = L - max(0, X_r * u_r + d - spare) / u,  spare = max(0, a*c - L*u)

with ``d = RAY_NODE_CORES`` what Ray's daemons on the trainer's node and the driver's own threads take
even idle (the profile ran without them), ``L`` the local-only rate at the asked point, ``u`` the job's CPU per sample and ``a*c`` the cores
it gets. The job runs at ``min(compute, X_local + X_r, F)``: batches are shared demand-driven (the
faster side gets more), so the sum holds while neither side's share is capped; the remote CPUs read the
same storage (or get the trainer's reads), so the fetch stage ``F`` still holds.

**The epoch's end.** Batches are handed out in the sampler's order; once the sampler is empty each side
can only finish what it holds. coordl gives torch's workers a batch only while their queue would end
no later than the actors' (:mod:`coordl.remote.epoch`), so the two end about together, but the workers'
last round of batches (``W`` of them, each ``B / L`` apart at the local-only rate ``L``) ends after the
actors' on average, and no batch is drawn while torch stops its workers and starts the next epoch's,
which the profile measures as the job's epoch start ``S`` (the first batch's excess wait):

    drain = W * B / L + S   seconds per epoch the remote CPUs idle

so the remote CPUs work ``1 - drain * X / items`` of each epoch, and ``X`` solves the formula above with
``X_r`` scaled by that share. Measured on the 2-core Intel VM (2026-11-28, 1,000 items, one worker, one
remote CPU): the remote core idle about 0.08 s of each 0.90 s epoch, of which 37 ms waiting on the
worker's last batch and about 30 ms while torch stops its worker and starts the next epoch's (the
profile's ``S``: 38 ms). Before that rule the workers drained a queue of ``prefetch + 2 * depth`` batches alone:
0.22 s of each 0.93 s epoch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsanalyzer.model.cores import job_cpu_per_sample, worker_cpu_s
from dsanalyzer.model.params import JobParams
from dsanalyzer.model.rates import Prediction
from dsanalyzer.model.remedy import Remedy

__all__ = [
    "RAY_NODE_CORES",
    "RECEIVE_S_PER_BYTE",
    "SEND_S_PER_BYTE",
    "RemoteSetup",
    "epoch_drain_s",
    "receive_cpu_s",
    "remote_rate",
    "remedy",
    "with_remote",
]

# The trainer's CPU per byte of a remote sample, as the trainer's core loses it beside its local workers
# (Ray's transfer into the head's object store, the feeder thread, the tail and collate, and what sharing
# the core with them costs the local worker), per wire byte: on the AMD EPYC VM (2026-11-27) 13.9 ms of
# core 0 per remote batch of 32 uint8 crops of 224 px (4.8 MB), 0.43 ms a sample; on the Intel Xeon VM
# (2026-11-28, 4,000 items, the remote core 91% busy) the local worker lost 0.50 ms per remote sample.
# The middle, 0.465 ms per 150,528 bytes; each host's own figure moves the 1-CPU prediction by about 4%.
# Not scaled by the profile's memory bandwidth: that measurement moved from 7.5 to 12.5 GB/s between
# profiles on one host (2026-11-28), and the prediction with it by 20%, while the runs held.
RECEIVE_S_PER_BYTE = 0.465e-3 / 150_528
# The prep node's CPU per byte it sends back, beyond the prep itself: on the Intel Xeon VM (2026-11-28,
# remote prep only, the node 99% busy, three runs) 39.8-40.5 ms of the node's CPU per remote batch (31.25
# crops of 224 px on average: 1.28 ms a sample) against 1.04 ms a sample for the actor's own prep alone
# on the same core (coordl.remote.actor.prep_batch, the uint8 recipe, its reads included): 0.24 ms a
# sample, 0.24 ms per 150,528 B. (The AMD EPYC VM's 0.04 ms of 2026-11-27 set the node's cost against the
# float recipe's prep and collate in one process, which the node does not run: not comparable.)
SEND_S_PER_BYTE = 0.24e-3 / 150_528
# Cores a Ray node's daemons (raylet, GCS and agents on a head) and the driver's own Ray threads take on
# the trainer's node with nothing running: on the Intel Xeon VM (2026-11-28, 10 s idle, the test cluster)
# the head's processes 0.019 and the trainer's Ray threads 0.004; the prep node alone 0.013.
RAY_NODE_CORES = 0.02
_INDEX_BYTES = 16  # an index and its seed, sent per item


@dataclass(frozen=True)
class RemoteSetup:
    """The remote side asked for: ``cpus`` remote CPUs, each sample ``wire_bytes`` back over a link of
    ``link_bytes_per_s`` (inf: not limiting), with the raw bytes shipped out when ``ship``."""

    cpus: int
    wire_bytes: float
    link_bytes_per_s: float = math.inf
    ship: bool = False


def remote_rate(job: JobParams, setup: RemoteSetup) -> float:
    """``X_r``: samples/s the remote CPUs send back (their prep, capped by the link)."""
    if setup.cpus <= 0:
        return 0.0
    prep = setup.cpus / (worker_cpu_s(job) + SEND_S_PER_BYTE * setup.wire_bytes)
    moved = setup.wire_bytes + _INDEX_BYTES + (job.avg_item_bytes if setup.ship else 0.0)
    link = setup.link_bytes_per_s / moved if moved > 0 else math.inf
    return min(prep, link)


def receive_cpu_s(job: JobParams, setup: RemoteSetup) -> float:
    """``u_r``: the trainer's CPU seconds per remote sample (receive, finish, hand out, the step's share)."""
    membw = job.mem_bandwidth_bytes_per_s or 0.0
    receive = RECEIVE_S_PER_BYTE * setup.wire_bytes
    shipped = job.avg_item_bytes / membw if (setup.ship and membw > 0) else 0.0  # read here, sent on
    step = (job.step_cpu_s or 0.0) / job.batch_size
    return receive + shipped + step


def epoch_drain_s(job: JobParams, setup: RemoteSetup, local_rate: float) -> float:
    """Seconds of each epoch the remote CPUs idle while torch's workers finish their last round (the
    module docstring); 0 without local workers."""
    if job.workers <= 0 or setup.cpus <= 0 or local_rate <= 0:
        return 0.0
    return job.workers * job.batch_size / local_rate + max(0.0, job.epoch_start_s)


def with_remote(
    job: JobParams, local: Prediction, setup: RemoteSetup, cores: float, compute: float
) -> Prediction:
    """The job at ``local``'s operating point (the local-only prediction, on ``cores`` cores) with the
    remote side ``setup`` added; ``compute`` is the job's compute rate there."""
    x_full = remote_rate(job, setup)
    if x_full <= 0:
        return local
    rate_local = local.steady
    u = job_cpu_per_sample(job) or (1.0 / job.prep.rate(1))
    u_r = receive_cpu_s(job, setup)
    spare = max(0.0, job.cpu_share * cores - rate_local * u)
    # the remote CPUs read the same storage (or are sent what the trainer read): the fetch stage holds
    fetch = local.stage_rates.get("fetch", math.inf)
    items = job.epoch_items or job.dataset_items
    drain = epoch_drain_s(job, setup, rate_local)
    rate = rate_local
    for _ in range(50):  # the busy share depends on the epoch's length, which depends on the rate
        busy = max(0.0, 1.0 - drain * rate / items) if items else 1.0
        x_r = x_full * busy
        x_local = max(0.0, rate_local - max(0.0, x_r * u_r + RAY_NODE_CORES - spare) / u)
        rate, before = min(compute, x_local + x_r, fetch), rate
        if abs(rate - before) <= 1e-9 * rate:
            break
    bound = "compute" if rate >= compute * (1 - 1e-6) else "fetch" if rate >= fetch * (1 - 1e-6) else "prep"
    stages = {**local.stage_rates, "remote": x_r, "local_with_remote": x_local}
    return Prediction(rate, items / rate, bound, stages, local.hit_ratio, local.per_iter_s)


def remedy(job: JobParams, local: Prediction, setup: RemoteSetup, cores: float, compute: float) -> Remedy:
    """:func:`with_remote` as a :class:`~dsanalyzer.model.remedy.Remedy` for the verdict's ranking."""
    p = with_remote(job, local, setup, cores, compute)
    return Remedy(
        name="remote_prep",
        samples_per_s=p.samples_per_s,
        bound=p.bound,
        cost={"remote_cpus": setup.cpus},
        loader_args={"remote_prep": f"coordl.RemotePrep('HEAD_HOST:PORT', cpus={setup.cpus})"},
        note=(
            f"{p.stage_rates['remote']:.0f} samples/s from {setup.cpus} remote CPU(s), "
            f"{p.stage_rates['local_with_remote']:.0f} local (its cores receive the remote batches)"
        ),
    )

"""The partitioned cache over N nodes (``coordl.DataLoader(partitioned=True)``): one node's samples/s.

CoorDL's partitioned caching (Mohan et al., VLDB 2021; :mod:`coordl.partitioned`): each of ``N`` nodes
caches ``C`` bytes of the items it owns, so together they hold ``min(D, N C)`` of a dataset of ``D``
bytes; a node reads its own share from memory, the other nodes' shares from their Redis over its link,
and only what no node holds from storage. Each node reads ``1/N`` of every epoch (a
``DistributedSampler``-like shard), uniformly over the dataset, so of its reads::

    held    = min(1, N C / D)           the share of the dataset some node caches
    local   = held / N                  from its own MinIO cache (memory)
    remote  = held (N - 1) / N          a remote hit: over the node's link from the owner's Redis
    storage = 1 - held                  a miss

A remote hit costs one worker ``s / (link x e) + peer_item_s`` plus, once per batch, the MGET's round
trip ``peer_batch_s`` (all owners are asked at once): ``s`` the item's bytes at the link's useful rate,
and the client's and server's own copies, which the profile measures on loopback Redis
(:mod:`dsanalyzer.measure.peer`; 0 when not probed). ``e`` (:func:`link_efficiency`) is the share of
the nominal link rate that carries items, measured on tc-tbf links between network namespaces (two
reading threads per node, MGETs of 50 kB items, runs of 10 s on the 2-core VM, 2026-11-27): TCP over
Ethernet carries 1448 payload bytes per 1514-byte frame (0.956; one node reading another got 0.954);
in the partitioned cache every node serves as much as it reads, so a worker's next MGET waits behind the
replies its own node is sending: two nodes 0.879-0.932 (mean 0.915, six runs, 24 and 100 Mbit/s); from
three nodes on, a node's outgoing link serves several readers and its incoming link several senders, and
a reply runs at the pace of the busier end while the other idles: three nodes 0.722-0.823 (mean 0.78,
nine runs). Four or more nodes were not measured; the model keeps 0.78. A real wire's preamble and gap
take 1.3 % more. The node's link is one more shared resource beside
storage, so the fetch stage runs at::

    F = 1 / max(local s/membw + storage s/storage_bw,  remote s/(link e))

and a worker's cycle at ``w / (local s/membw + remote (s/(link e) + peer_item_s + peer_batch_s/B) +
storage (s/storage_bw + overhead_s) + w/P)``: the rest of the composition is the single node's
(:func:`~dsanalyzer.model.rates.compose`, the step, prep and shared cores unchanged), over an epoch of
``ceil(E/N)`` samples with the measured epoch start. With ``N = 1`` this is exactly the single node's
prediction with a MinIO cache of ``C``. Storage is each node's own (a local disk, as measured on this
one); ``shared_storage=True`` divides the measured bandwidth among the N nodes (one NFS server).

What the model leaves out: coordl's self-started Redis accepts up to ``1.3 C + 64 MiB`` of pushes
(``coordl.partitioned.tier.redis_maxmemory``), so a node given less than its share ``D/N`` holds a little
more than ``C`` and the prediction is then a lower bound; the Redis client's CPU per remote item is
counted in the worker's cycle, not in the shared cores' rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dsanalyzer.model import epoch_start, stages
from dsanalyzer.model.cores import job_cpu_rate
from dsanalyzer.model.params import JobParams
from dsanalyzer.model.rates import ItemCosts, Prediction, compose
from dsanalyzer.model.remedy import Remedy

__all__ = [
    "LINK_EFFICIENCY",
    "link_efficiency",
    "DEFAULT_PEER_GBPS",
    "Shares",
    "PeerCosts",
    "shares",
    "predict_nodes",
    "nodes_remedy",
    "share_cache_bytes",
]

LINK_EFFICIENCY = {2: 0.915, 3: 0.78}  # useful share of a node link carrying the cache's traffic (measured)
DEFAULT_PEER_GBPS = 10.0  # the node link the CLI assumes when --peer-gbps is not given
SHARE_SLACK = 1.1  # the cache a remedy gives each node: its share of the dataset plus 10 % (items differ)


@dataclass(frozen=True)
class Shares:
    """Where one node's reads come from: its own cache, the other nodes' caches, storage (sum 1)."""

    local: float
    remote: float
    storage: float

    @property
    def held(self) -> float:
        return self.local + self.remote


def shares(dataset_bytes: float, cache_bytes: float, nodes: int) -> Shares:
    """The shares of a node's reads with ``nodes`` nodes caching ``cache_bytes`` each."""
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    if cache_bytes < 0:
        raise ValueError(f"cache_bytes must be >= 0, got {cache_bytes}")
    held = 1.0 if dataset_bytes <= 0 else min(1.0, nodes * cache_bytes / dataset_bytes)
    return Shares(local=held / nodes, remote=held * (nodes - 1) / nodes, storage=1.0 - held)


def link_efficiency(nodes: int) -> float:
    """The share of a node link's nominal rate that carries items with ``nodes`` nodes (measured: see above)."""
    return LINK_EFFICIENCY[2] if nodes <= 2 else LINK_EFFICIENCY[3]


def share_cache_bytes(job: JobParams, nodes: int) -> int:
    """The cache each node needs to hold its share of the dataset, with :data:`SHARE_SLACK`."""
    return math.ceil(job.dataset_bytes / nodes * SHARE_SLACK)


@dataclass(frozen=True)
class PeerCosts(ItemCosts):
    """:class:`~dsanalyzer.model.rates.ItemCosts` with a third source, the other nodes' caches over the link.

    ``hit_s``/``miss_s``/``miss_overhead_s`` are the local hit's and the storage miss's, as for one node;
    the shares replace the hit ratio that :func:`~dsanalyzer.model.rates.compose` passes in.
    """

    local: float = 1.0
    remote: float = 0.0
    link_s: float = 0.0  # an item's bytes over the node's link (the shared resource)
    remote_own_s: float = 0.0  # a remote item's own cost in the worker: copies, its part of the round trip

    @property
    def storage(self) -> float:
        return max(0.0, 1.0 - self.local - self.remote)

    def aggregate_s(self, h: float) -> float:
        """Seconds per item of the busier shared resource: memory + storage, or the link."""
        return max(self.local * self.hit_s + self.storage * self.miss_s, self.remote * self.link_s)

    def worker_s(self, h: float) -> float:
        """One worker's seconds per item: each source's cost, its latency included, in turn."""
        return (
            self.local * self.hit_s
            + self.remote * (self.link_s + self.remote_own_s)
            + self.storage * (self.miss_s + self.miss_overhead_s)
        )


def predict_nodes(
    job: JobParams,
    nodes: int,
    point: stages.Point,
    link_bytes_per_s: float,
    shared_storage: bool = False,
) -> Prediction:
    """One node's samples/s with ``nodes`` nodes partitioning their caches of ``point.cache_bytes`` each.

    ``point`` is the node's operating point (its cores, workers, storage, GPU); its cache policy is
    coordl's MinIO cache whatever it says. ``link_bytes_per_s``: each node's link (bytes/s, nominal).
    The job's aggregate is ``nodes`` times the returned rate.
    """
    if not link_bytes_per_s > 0:
        raise ValueError(f"the node link must be positive, got {link_bytes_per_s} bytes/s")
    sh = shares(job.dataset_bytes, point.cache_bytes, nodes)
    storage_bw = point.storage_bytes_per_s / nodes if shared_storage else point.storage_bytes_per_s
    p = replace(point, policy="minio", storage_bytes_per_s=storage_bw)
    base = stages.fetch_costs(job, p, sh.held)
    costs = PeerCosts(
        hit_s=base.hit_s, miss_s=base.miss_s, miss_overhead_s=base.miss_overhead_s,
        local=sh.local, remote=sh.remote,
        link_s=job.avg_item_bytes / (link_bytes_per_s * link_efficiency(nodes)),
        remote_own_s=(job.peer_item_s or 0.0) + (job.peer_batch_s or 0.0) / job.batch_size,
    )  # fmt: skip
    w, g = p.workers, p.gpu_speedup
    epoch = math.ceil((job.epoch_items or job.dataset_items) / nodes)
    steady = compose(
        step_per_s=job.compute_per_s * g,
        compute_per_s=stages.compute_rate(job, g),
        prep_per_s=stages.prep_rate(job, w, p.cpus),
        costs=costs,
        h=sh.held,
        workers=w,
        batch_size=job.batch_size,
        dataset_items=epoch,
        cpu_per_s=job_cpu_rate(job, p.cpus, w, g, "minio", sh.held),
    )
    start = epoch_start.epoch_start_at(job, steady, w)
    return steady.with_epoch_start(start, epoch)


def nodes_remedy(
    job: JobParams,
    nodes: int,
    link_bytes_per_s: float,
    point: stages.Point | None = None,
    shared_storage: bool = False,
) -> Remedy:
    """The partitioned cache over ``nodes`` nodes as a :class:`~dsanalyzer.model.remedy.Remedy` (per node).

    ``point`` defaults to the profiled cores and workers with each node caching its share of the
    dataset plus 10 % (:func:`share_cache_bytes`); its ``cache_bytes`` is the per-node budget.
    """
    if point is None:
        point = stages.Point(share_cache_bytes(job, nodes), job.cpus, job.storage_bytes_per_s,
                             workers=job.workers)  # fmt: skip
    pred = predict_nodes(job, nodes, point, link_bytes_per_s, shared_storage)
    sh = shares(job.dataset_bytes, point.cache_bytes, nodes)
    return Remedy(
        name="nodes",
        samples_per_s=pred.samples_per_s,
        bound=pred.bound,
        cost={"nodes": nodes, "memory_bytes": float(point.cache_bytes)},  # memory: per node
        loader_args={"cache_bytes": int(point.cache_bytes), "partitioned": True},
        note=(
            f"per node, {nodes} nodes (aggregate {nodes * pred.samples_per_s:.1f} samples/s), each caching "
            f"{point.cache_bytes / 1e9:.3g} GB; of a node's reads {sh.local:.0%} local, {sh.remote:.0%} over a "
            f"{link_bytes_per_s * 8 / 1e9:g} Gbit/s link, {sh.storage:.0%} storage; torchrun --nnodes {nodes}"
        ),
    )

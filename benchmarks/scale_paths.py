"""The scale curve's "other paths": each of coordl's caches and formats measured at ``n`` tiny items.

``benchmarks/bench_scale.py`` (issue 59) calls each function of :data:`SECTIONS` for ``n`` in 10^3 .. 10^6
(10^7 where only an index or a listing is involved, up to the section's largest ``n``) and prints the
curve. Each function builds what it needs under ``work`` (a fresh directory the caller deletes), stops
every server and process it starts, and returns plain numbers: seconds (``*_s``), bytes (``*_bytes``),
counts, and ``*_per_item`` values so that a cost that grows faster than the item count shows as a
growing per-item figure. Items are 16 bytes, so the loader's own costs show, not the payload's.

    .venv/bin/python benchmarks/scale_paths.py minio_index 100000     # one section at one n (debugging)

The sections that write files (``packed``, ``nfs_staging``, ``dsanalyzer_profile``) and the helpers all
sections share live in ``benchmarks/scale_paths_files.py``; this module names them all.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # a sibling module, however this is run

from scale_paths_files import (  # noqa: E402
    BATCH,
    ITEM_BYTES,
    Metrics,
    dsanalyzer_profile,
    nfs_staging,
    packed,
    sample_indices,
    tiny_item,
    traced_bytes,
)

__all__ = ["Metrics", "SECTIONS", "minio_index", "partitioned_state", "coordinated_state", "packed"]


# -- MinIO cache --------------------------------------------------------------------------------------


def minio_index(n: int, work: Path) -> Metrics:
    """The MinIO cache's index at ``n`` items: bytes per entry, build (create + fill) time, lookup time.

    The cache lives where a user's does (``/dev/shm`` when it has room), sized for exactly ``n`` items of
    16 bytes; ``close()`` removes its segment.
    """
    from coordl.fetch.minio import MinioCache
    from shmem.table import table_bytes

    t0 = time.perf_counter()
    cache = MinioCache(ITEM_BYTES * n, n, name="scale")
    create_s = time.perf_counter() - t0
    try:
        items = np.zeros((n, ITEM_BYTES // 8), dtype="<u8")  # item i: its index (as tiny_item), one block
        items[:, 0] = np.arange(n)
        view = memoryview(items.data).cast("B")
        t0 = time.perf_counter()
        stored = sum(cache.put(i, view[ITEM_BYTES * i : ITEM_BYTES * (i + 1)]) for i in range(n))
        fill_s = time.perf_counter() - t0
        view.release()
        del items
        lookups = sample_indices(n)
        t0 = time.perf_counter()
        for i in lookups:
            cache.get(i)
        get_s = time.perf_counter() - t0
        last = cache.get(n - 1)
        assert last is not None and bytes(last) == tiny_item(n - 1), f"minio: item {n - 1} read back wrong"
        del last
        path = cache.paths[0]
        st = os.stat(path)
        index_bytes = table_bytes(n, 0, dense=True)
        stats = cache.stats()
    finally:
        cache.close()
    return {
        "items": n,
        "stored_items": stored,
        "cached_items": int(stats["cached_items"]),
        "backend": str(stats["cache_backend"]),
        "index_bytes": index_bytes,
        "index_bytes_per_item": index_bytes / n,
        "segment_bytes": st.st_size,
        "segment_bytes_per_item": st.st_size / n,
        "segment_resident_bytes": st.st_blocks * 512,
        "create_s": create_s,
        "fill_s": fill_s,
        "fill_s_per_item": fill_s / n,
        "lookup_s_per_item": get_s / len(lookups),
    }


# -- partitioned cache --------------------------------------------------------------------------------


def _owner_maps(n: int) -> Metrics:
    from coordl.partitioned.ownership import OwnerMap, PartitionedSampler

    out: Metrics = {}
    OwnerMap(10, num_nodes=2)  # NumPy's random module loads its parts on first use: not the map's bytes
    for nodes in (2, 8):
        t0 = time.perf_counter()
        owners = OwnerMap(n, num_nodes=nodes, seed=1)
        build_s = time.perf_counter() - t0
        del owners
        with traced_bytes() as held:  # built again: tracing slows allocations down, so it is not timed
            owners = OwnerMap(n, num_nodes=nodes, seed=1)
        t0 = time.perf_counter()
        owned = owners.owned(0)
        owned_s = time.perf_counter() - t0
        lookups = sample_indices(n)
        t0 = time.perf_counter()
        for i in lookups:
            owners.owner(i)
        owner_s = time.perf_counter() - t0
        sampler = PartitionedSampler(n, nodes, 0, seed=1)
        t0 = time.perf_counter()
        shard = sampler.indices()
        epoch_s = time.perf_counter() - t0
        out.update({
            f"owner_map_{nodes}_build_s": build_s,
            f"owner_map_{nodes}_build_s_per_item": build_s / n,
            f"owner_map_{nodes}_bytes": held[0],
            f"owner_map_{nodes}_bytes_per_item": held[0] / n,
            f"owned_{nodes}_s": owned_s,
            f"owned_{nodes}_items": len(owned),
            f"owner_lookup_{nodes}_s_per_item": owner_s / len(lookups),
            f"sampler_{nodes}_epoch_s": epoch_s,
            f"sampler_{nodes}_shard_items": len(shard),
        })  # fmt: skip
    return out


def _redis_epoch(n: int, work: Path) -> Metrics:
    """One epoch of a 2-node job's partitioned cache, both nodes in this process, each with its own
    redis-server: node k reads its sampler shard batch by batch through its tier (``get_many``), reads
    what nobody has from "storage" and offers it (owned items to its MinIO cache and, as a multi-node
    loader does (``mirror_local``), to its own Redis; the rest pushed to the owner). The pushes are
    flushed after every batch so that none is dropped by a full push queue: the key count is then the
    items of the epoch (every item read once lands at its owner)."""
    from coordl.fetch.minio import MinioCache
    from coordl.partitioned.fetch import PartitionedTier
    from coordl.partitioned.ownership import OwnerMap, PartitionedSampler
    from coordl.partitioned.redis_peer import PEER_COUNTERS, RedisPeerClient, key_prefix
    from memcache.server import start_redis
    from shmem.counters import SharedCounters

    password = "s" * 32
    owners = OwnerMap(n, num_nodes=2, seed=1)
    budget = 2 * n * 200 + (64 << 20)  # ~100 B per key of Redis overhead, with room to spare
    servers: list[Any] = []
    made: list[Any] = []
    try:
        for k in range(2):
            servers.append(start_redis(budget, password=password, workdir=work / f"redis{k}"))
        empty = sum(_redis_info(s, password)[1] for s in servers)
        addresses = [(s.host, s.port) for s in servers]
        tiers = []
        for k in range(2):
            made.append(cache := MinioCache(ITEM_BYTES * n, n, name=f"node{k}"))
            made.append(counters := SharedCounters(["cache_hits", "cache_misses"]))
            made.append(peer := SharedCounters(PEER_COUNTERS))
            client = RedisPeerClient(addresses, password=password, prefix=key_prefix(f"scale-{n}"))
            tier = PartitionedTier(owners, k, client, counters, local_cache=cache, mirror_local=True,
                                   peer_counters=peer)  # fmt: skip
            made.append(tier)
            tiers.append(tier)
        t0 = time.perf_counter()
        read = 0
        for k, tier in enumerate(tiers):
            shard = PartitionedSampler(n, 2, k, seed=1).indices().tolist()
            for start in range(0, len(shard), BATCH):
                batch = shard[start : start + BATCH]
                got = tier.get_many(batch)
                for i in batch:
                    if i not in got:
                        tier.offer(i, tiny_item(i))
                        read += 1
                tier.flush()
        epoch_s = time.perf_counter() - t0
        keys, mem = zip(*(_redis_info(s, password) for s in servers), strict=True)
    finally:
        for part in reversed(made):  # each tier before its cache and counters
            part.close()
        for s in servers:
            s.stop()
    return {
        "redis_nodes": 2,
        "redis_epoch_s": epoch_s,
        "redis_epoch_s_per_item": epoch_s / n,
        "redis_storage_reads": read,
        "redis_keys": sum(keys),
        "redis_keys_per_item": sum(keys) / n,
        "redis_used_bytes": sum(mem),
        "redis_bytes_per_key": (sum(mem) - empty) / max(1, sum(keys)),
    }


def _redis_info(server: Any, password: str) -> tuple[int, int]:
    """(keys, used_memory bytes) of a redis-server."""
    import redis

    r = redis.Redis(host=server.host, port=server.port, password=password)
    try:
        return int(r.dbsize()), int(r.info("memory")["used_memory"])
    finally:
        r.close()


def partitioned_state(n: int, work: Path) -> Metrics:
    """The partitioned cache's state at ``n`` items: the ownership map for 2 and 8 nodes (build time and the
    bytes it holds), the per-epoch sampler, and the Redis keys after one epoch of 2 nodes (real servers)."""
    return {"items": n, **_owner_maps(n), **_redis_epoch(n, work)}


# -- coordinated prep ---------------------------------------------------------------------------------


def index_batch(indices: list[int]) -> Any:
    """A batch that costs no prep: the indices themselves (so the epoch's time is the group's control work)."""
    import torch

    return torch.tensor(indices, dtype=torch.int64)


def coordinated_state(n: int, work: Path) -> Metrics:
    """Coordinated prep's control state and its per-epoch work at ``n`` items.

    One job of a group (one producer, batches of 256) whose batches cost nothing to make (the indices): an
    epoch's time is the group's own work (claims, slot states, doorbells, the epoch's permutation, decoding
    the batch from the ring). The control block's size, the ring's, and the permutation (``epoch_order``,
    made once per epoch in every producer) are given apart.
    """
    import multiprocessing as mp

    from coordl.coordinated.job import Group, GroupMember
    from coordl.coordinated.producer import epoch_order

    t0 = time.perf_counter()
    order = epoch_order(n, 0, True, 0)
    order_s = time.perf_counter() - t0
    order_bytes = order.numel() * order.element_size()
    del order
    group = Group(f"scale-{os.getpid()}-{n}", slots=8, directory=str(work))
    t0 = time.perf_counter()
    member = GroupMember(group, num_items=n, batch_size=BATCH, drop_last=False, shuffle=True,
                         make_batch=index_batch, num_producers=1, mp_context=mp.get_context("fork"))  # fmt: skip
    try:
        join_s = time.perf_counter() - t0
        ctl_bytes = os.path.getsize(member.base + ".ctl")
        ring_bytes = os.path.getsize(member.base + ".data")
        epochs = []
        for _ in range(2):
            seen = 0
            t0 = time.perf_counter()
            for batch in member.epoch():
                seen += len(batch)
            epochs.append(time.perf_counter() - t0)
        batches = len(member)
    finally:
        member.close()
    return {
        "items": n,
        "batches_per_epoch": batches,
        "items_seen": seen,
        "ctl_bytes": ctl_bytes,
        "ring_bytes": ring_bytes,
        "join_s": join_s,
        "epoch1_s": epochs[0],
        "epoch2_s": epochs[1],
        "epoch_s_per_item": min(epochs) / n,
        "epoch_s_per_batch": min(epochs) / batches,
        "epoch_order_s": order_s,
        "epoch_order_bytes": order_bytes,
    }


# name -> (function, the largest n it runs at); see each cap's reason.
SECTIONS: dict[str, tuple[Callable[[int, Path], Metrics], int]] = {
    "minio_index": (minio_index, 10**7),  # an index only: 10^7 items are 560 MB of /dev/shm, 1-3 min to fill
    "partitioned_state": (partitioned_state, 10**6),  # a real Redis epoch: 10^7 keys would be ~1 GB of Redis
    "coordinated_state": (coordinated_state, 10**6),
    # 10^6 takes 13 min on this host when shared (3-4 when quiet): tar packs with Python's tarfile, ~110 us of
    # CPU per item (two members), and writes 2 KB per tiny item (two 512-byte headers + blocks): 2.1 GB.
    "packed": (packed, 10**6),
    # 10^5: each file is written (the "remote"), staged (0.2-0.5 ms each on this shared 2-core VM) and then
    # unlinked with `work` by the caller: 3-4 ms per unlink on this disk (ext4 mounted with discard), an hour
    # at 10^6 even with SCALE_TREE_ROOT keeping the remote tree. Per-file figures are flat from 10^3 to 10^5;
    # run `scale_paths.py nfs_staging 1000000` on a quiet host with a faster disk.
    "nfs_staging": (nfs_staging, 10**5),
    # (10^6 since evict_files flushes with one sync(), not an fdatasync per file: 2.1-2.4 ms per clean file on
    # this VM's disk made a profile of 10^6 files spend ~40 min flushing)
    "dsanalyzer_profile": (dsanalyzer_profile, 10**6),
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in SECTIONS:
        print(f"usage: scale_paths.py {{{','.join(SECTIONS)}}} N", file=sys.stderr)
        return 2
    fn, _ = SECTIONS[args[0]]
    with tempfile.TemporaryDirectory(prefix=f"scale-{args[0]}-") as work:
        t0 = time.perf_counter()
        metrics = fn(int(float(args[1])), Path(work))
        metrics["section_s"] = time.perf_counter() - t0
    print(json.dumps(metrics, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One MinIO cache per node for all the ranks of a distributed job that read the same dataset.

CoorDL's MinIO cache is a server's: every training process on the machine reads the same items, so
they share one budget and one copy of each item (Mohan et al., VLDB 2021). Under DDP each rank builds
its own loader; without sharing, a node with 8 ranks and ``cache_bytes=8 GiB`` would allocate 64 GiB,
and, since a distributed sampler hands each rank a different shard every epoch, each rank's cache would
hold only the items *it* saw: an epoch-2 hit ratio of about ``1 / ranks per node`` instead of 1.

So the first rank of the node to build a loader creates the cache and publishes its segment's path in a
small rendezvous file named after the job and the data; the node's other ranks find it there and attach.
No collective runs (a loader built on one rank only never hangs) and no bytes are unpickled: the file
holds a path. The rendezvous name is derived from:

* the job: ``MASTER_ADDR``, ``MASTER_PORT`` (torchrun, Lightning, Accelerate and ``mp.spawn`` jobs all set
  them), ``TORCHELASTIC_RUN_ID`` and ``TORCHELASTIC_RESTART_COUNT`` (a restarted job gets a fresh cache);
* the data: the dataset's ``dataset_identity()`` (``coordl.ImageFolder``, ``FileListDataset``, tar and
  LMDB sources have one), else the paths ``describe(i)`` gives for its first and last items; a dataset
  with neither is never shared (two different datasets of equal length must not serve each other's
  bytes), and each rank keeps a cache of its own, as before;
* the cache's shape: budget, number of items and directory.

Inside one process, loaders with the same key share one :class:`MinioCache` object, counted: Lightning
builds a loader, then a replacement from its arguments, and the replacement must reuse the cache, not
allocate a second one. The cache is closed (and, by its creator, unlinked with its rendezvous) when the
last loader of the process using it closes, or at the creator's exit. A rendezvous that points at a
cache whose creator is gone (killed) is removed by the next process that opens a node cache. Races between ranks creating at once end with one winner (``os.link``
refuses an existing name); the loser attaches to the winner's cache.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
from typing import Any

from coordl.fetch.minio import MinioCache
from shmem.segment import DEFAULT_DIR, SEGMENT_NAME_RE, owner_alive

__all__ = ["open_minio", "close_minio", "node_key", "data_identity"]

log = logging.getLogger("coordl")

# key -> [cache, loaders of this process using it, the rendezvous path when this process created it]
_OPEN: dict[str, list[Any]] = {}


def data_identity(source: Any) -> str | None:
    """A string naming the data ``source`` reads, or None when it cannot say (then nothing is shared)."""
    ident = getattr(source, "dataset_identity", None)
    if callable(ident):
        return f"id:{ident()}"
    describe = getattr(source, "describe", None)
    if callable(describe) and len(source):
        first, last = str(describe(0)), str(describe(len(source) - 1))
        if first != "item 0":
            return f"paths:{first}|{last}"
    return None


def node_key(identity: str | None, capacity_bytes: int, num_items: int, directory: str | None) -> str | None:
    """The rendezvous key of a cache shared by a node's ranks, or None when not in a distributed job."""
    env = os.environ
    if identity is None or _world_size() <= 1 or "MASTER_PORT" not in env:
        return None
    job = [
        env.get(k, "")
        for k in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")
    ]
    text = "\0".join([*job, identity, str(capacity_bytes), str(num_items), str(directory)])
    return hashlib.blake2b(text.encode(), digest_size=10).hexdigest()


def _world_size() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def open_minio(
    capacity_bytes: int, num_items: int, *, directory: str | None, name: str, identity: str | None
) -> MinioCache:
    """The node's cache for this data (created, attached or reused), or a cache of this rank's own."""
    key = node_key(identity, capacity_bytes, num_items, directory)
    if key is None:
        return MinioCache(capacity_bytes, num_items, directory=directory, name=name)
    entry = _OPEN.get(key)
    if entry is not None:
        entry[1] += 1
        return entry[0]
    _sweep(directory or DEFAULT_DIR)
    cache, created = _attach_or_create(key, capacity_bytes, num_items, directory, name)
    _OPEN[key] = [cache, 1, created]
    return cache


def close_minio(cache: MinioCache) -> None:
    """This loader is done with ``cache``: close it when no loader of this process uses it any more."""
    for key, entry in list(_OPEN.items()):
        if entry[0] is cache:
            entry[1] -= 1
            if entry[1] > 0:
                return
            del _OPEN[key]
            if entry[2] is not None:
                _unpublish(entry[2], cache.paths[0])
            break
    cache.close()


def _rendezvous(key: str, directory: str | None) -> str:
    return os.path.join(directory or DEFAULT_DIR, f"coordl-nodecache-{key}")


def _attach_or_create(
    key: str, capacity_bytes: int, num_items: int, directory: str | None, name: str
) -> tuple[MinioCache, str | None]:
    """Attach to the node's published cache, or create and publish it. Returns (cache, rendezvous if created)."""
    where = _rendezvous(key, directory)
    for _attempt in range(3):
        found = _attach(where, capacity_bytes, num_items, name)
        if found is not None:
            log.info("coordl: %s: sharing this node's MinIO cache %s", name, found.paths[0])
            return found, None
        cache = MinioCache(capacity_bytes, num_items, directory=directory, name=name)
        if _publish(where, cache.paths[0]):
            atexit.register(
                _unpublish, where, cache.paths[0], os.getpid()
            )  # a process ending without close()
            return cache, where
        cache.close()  # another rank published first: use theirs
    # Could not settle on one (rendezvous files churning): a cache of this rank's own is still correct.
    return MinioCache(capacity_bytes, num_items, directory=directory, name=name), None


def _attach(where: str, capacity_bytes: int, num_items: int, name: str) -> MinioCache | None:
    """The cache ``where`` points at, or None (no rendezvous, or a stale one, which is removed)."""
    try:
        with open(where) as f:
            path = f.read().strip()
    except FileNotFoundError:
        return None
    m = SEGMENT_NAME_RE.match(os.path.basename(path))
    if m is not None and m["kind"] == "minio" and owner_alive(int(m["pid"]), int(m["start"])):
        try:
            return MinioCache.attach(path, capacity_bytes, num_items, name=name)
        except FileNotFoundError:
            pass
    _unpublish(where, path)  # its creator is gone, or it names no cache of ours
    return None


def _publish(where: str, path: str) -> bool:
    """Name ``path`` at ``where`` atomically; False when another rank's rendezvous is already there."""
    tmp = f"{where}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(path)
    try:
        os.link(tmp, where)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def _unpublish(where: str, path: str, pid: int | None = None) -> None:
    """Remove the rendezvous ``where`` if it still points at ``path`` (and, given ``pid``, in that process only:
    a forked child inherits the exit hook)."""
    if pid is not None and os.getpid() != pid:
        return
    try:
        with open(where) as f:
            if f.read().strip() != path:
                return
        os.unlink(where)
    except FileNotFoundError:
        pass


def _sweep(directory: str) -> None:
    """Remove rendezvous files whose cache's creator is gone (a job killed before its exit hooks ran)."""
    try:
        names = [
            n for n in os.listdir(directory) if n.startswith("coordl-nodecache-") and not n.endswith(".tmp")
        ]
    except FileNotFoundError:
        return
    for name in names:
        where = os.path.join(directory, name)
        try:
            with open(where) as f:
                path = f.read().strip()
        except FileNotFoundError:
            continue
        m = SEGMENT_NAME_RE.match(os.path.basename(path))
        if m is None or not owner_alive(int(m["pid"]), int(m["start"])):
            _unpublish(where, path)

"""The fetch chain of one item source: the tiers asked for raw bytes before storage, nearest first.

Every loader front end (``coordl.DataLoader``, ``coordl.dali.DALILoader``) builds its fetch side here,
so the MinIO cache and the partitioned cache are made in exactly one place:

* ``cache_bytes > 0``: the node's MinIO cache (:mod:`coordl.fetch.minio`), as a :class:`MinioTier`; the
  ranks of a node in a distributed job share one (:mod:`coordl.fetch.node_cache`);
* ``partitioned=True`` (or a :class:`coordl.PartitionedOptions`, whose settings it passes on): the
  partitioned tier (:mod:`coordl.partitioned`), with the MinIO cache on the node leader as its local share.

Reading through the chain (ask the tiers, then storage, offer the bytes back) is
:meth:`coordl.fetch.pipeline.LoaderSource.fetch`.
"""

from __future__ import annotations

from typing import Any

from coordl.fetch.minio import MinioCache
from coordl.fetch.node_cache import close_minio, data_identity, open_minio
from coordl.fetch.tiers import FetchTier, MinioTier
from coordl.partitioned.options import PartitionedOptions, as_options
from coordl.partitioned.ownership import NodeTopology
from coordl.partitioned.tier import build_partitioned_tier
from shmem.counters import SharedCounters

__all__ = ["FetchChain"]


class FetchChain:
    """The fetch tiers for ``source``, built from the loader's cache options.

    Args:
        source: the item source (``len``, ``fetch``, ``prep``; ``opaque = True`` for adapted datasets
            that have no raw bytes).
        counters: shared counters holding at least ``cache_hits`` and ``cache_misses``.
        cache_bytes: this node's MinIO budget (0: no cache).
        cache_dir: directory for a file-backed cache (see :class:`MinioCache`).
        partitioned: share the cache across the nodes of a distributed job (needs ``cache_bytes``):
            True, or a :class:`PartitionedOptions` with its settings.
        name: the dataset's name, for the cache's segment and messages.
    """

    def __init__(
        self,
        source: Any,
        counters: SharedCounters,
        *,
        cache_bytes: int = 0,
        cache_dir: str | None = None,
        partitioned: bool | PartitionedOptions = False,
        name: str = "dataset",
    ) -> None:
        settings = as_options(partitioned)
        partitioned = settings is not None
        opaque = bool(getattr(source, "opaque", False))
        if partitioned and cache_bytes <= 0:
            raise ValueError(
                "partitioned=True needs cache_bytes > 0: this node's share of the partitioned cache"
            )
        if partitioned and opaque:
            raise ValueError(
                f"partitioned=True needs raw item bytes, but {name} has no fetch/prep split "
                "(use coordl.ImageFolder or implement fetch/prep)"
            )
        self.minio: MinioCache | None = None
        # An opaque dataset has no raw bytes to cache (as_item_source already warned about it). When
        # partitioned, only the node leader holds the cache; its other ranks reach it through its server.
        if cache_bytes > 0 and not opaque and (not partitioned or NodeTopology.from_env().is_node_leader):
            # A partitioned job's node leader holds the node's share alone; otherwise the node's ranks share.
            identity = None if partitioned else data_identity(source)
            self.minio = open_minio(
                cache_bytes, len(source), directory=cache_dir, name=name, identity=identity
            )
        self.tiers: list[FetchTier] = []
        if settings is not None:
            self.tiers.append(
                build_partitioned_tier(
                    len(source),
                    cache_bytes,
                    counters,
                    self.minio,
                    identity=data_identity(source),
                    tls=settings.tls,
                    push_wait_s=settings.push_wait_s,
                )  # fmt: skip
            )
        elif self.minio is not None:
            self.tiers.append(MinioTier(self.minio, counters))

    def stats(self) -> dict[str, Any]:
        """The cache keys every loader reports (zero without a cache), then each tier's own."""
        out: dict[str, Any] = {
            "cached_items": 0,
            "cached_bytes": 0,
            "capacity_bytes": 0,
            "cache_backend": "none",
        }
        for tier in self.tiers:
            out.update(tier.stats())
        return out

    def end_epoch(self) -> None:
        """An epoch ended: the tiers finish what they still send in the background (bounded; see
        :meth:`coordl.partitioned.fetch.PartitionedTier.end_epoch`)."""
        for tier in self.tiers:
            end = getattr(tier, "end_epoch", None)
            if callable(end):
                end()

    def close(self) -> None:
        """Stop the tiers (e.g. the node's cache server), then free the cache."""
        for tier in self.tiers:
            close = getattr(tier, "close", None)
            if callable(close):
                close()
        if self.minio is not None:
            close_minio(self.minio)

    def __repr__(self) -> str:
        return f"FetchChain(tiers={[t.name for t in self.tiers]}, cache={self.minio!r})"

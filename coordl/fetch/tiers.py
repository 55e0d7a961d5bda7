"""Asking the fetch tiers in order, then storage: one item's raw bytes and who gets offered them.

A fetch tier is one place raw item bytes can come from before storage is asked (:class:`FetchTier`:
the MinIO cache as :class:`MinioTier`, a peer's cache in :mod:`coordl.partitioned.fetch`).
:class:`TierLookup` asks them in order, falls back to the source's ``fetch`` (storage; or its
``fetch_uncached``, past the OS page cache, when :mod:`coordl.fetch.pagecache` says so), counts the
storage reads, and offers the bytes to every tier that missed. A tier that serves whole batches
(``get_many``: the partitioned cache) is asked once per batch, not once per item.

:class:`coordl.fetch.pipeline.LoaderSource` runs it for each item of a batch; the read-ahead threads
(:mod:`coordl.fetch.ahead`) run its parts split between threads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from coordl.fetch.minio import MinioCache
from coordl.fetch.pagecache import PageCachePolicy
from shmem.counters import SharedCounters
from shmem.forklock import PID

__all__ = ["FetchTier", "MinioTier", "TierLookup", "BASE_COUNTERS"]

BASE_COUNTERS = (
    "cache_hits", "cache_misses", "storage_bytes_read", "storage_items_read", "items_loaded", "skipped_items",
)  # fmt: skip


# What TierLookup.batch_fetch counts per batch, in the order of its tally.
_TALLIED = ("cache_hits", "cache_misses", "storage_bytes_read", "storage_items_read")


@runtime_checkable
class FetchTier(Protocol):
    """One place raw item bytes can come from before storage is asked."""

    name: str
    # Optional ``in_memory = True``: the tier answers from local memory, without blocking I/O.

    def get(self, index: int) -> bytes | memoryview | None:
        """The raw bytes of item ``index``, or None on a miss."""
        ...

    def offer(self, index: int, raw: bytes | memoryview) -> None:
        """Called with bytes a lower tier or storage produced after this tier missed."""
        ...

    def stats(self) -> dict[str, int]: ...


class MinioTier:
    """The MinIO cache as a fetch tier; counts ``cache_hits`` / ``cache_misses``."""

    name = "minio"
    in_memory = True  # answers without I/O: the loader's read-ahead asks it in the prep thread

    def __init__(self, cache: MinioCache, counters: SharedCounters) -> None:
        self.cache = cache
        self.counters = counters

    def get(self, index: int) -> memoryview | None:
        raw = self.cache.get(index)
        self.counters.add("cache_hits" if raw is not None else "cache_misses")
        return raw

    def offer(self, index: int, raw: bytes | memoryview) -> None:
        self.cache.put(index, raw)

    def stats(self) -> dict[str, Any]:
        return self.cache.stats()  # counts, and the cache's policy by name


class TierLookup:
    """One item's raw bytes: the tiers in order, then storage; the bytes offered to the tiers that missed.

    Args:
        source: the item source (``fetch``; optionally ``fetch_uncached``).
        tiers: fetch tiers, asked in order before storage. ``tiers`` is this list, kept: the loader
            inserts and removes tiers in it after it is built.
        counters: shared counters holding ``storage_bytes_read`` and ``storage_items_read``.
        page_cache: ``"auto"``, ``"use"`` or ``"bypass"`` (:mod:`coordl.fetch.pagecache`).
    """

    def __init__(
        self, source: Any, tiers: Sequence[FetchTier], counters: SharedCounters, page_cache: str
    ) -> None:
        self.source = source
        self.tiers = list(tiers)
        self.counters = counters
        self.page_cache = page_cache
        # tier id -> (its answers, the indices it was asked) for the batch being made
        self._batch_answers: dict[int, tuple[dict[int, Any], frozenset[int]]] = {}
        self._page_policy: tuple[int, PageCachePolicy] | None = None  # (pid, this process's policy)
        # What the batch being made counted so far (batch_fetch): cache hits, cache misses, storage bytes,
        # storage items; added to the shared counters once, at end_batch.
        self._tally = [0, 0, 0, 0]

    def fetch(self, index: int) -> bytes:
        """Raw bytes of ``index`` from the first tier that has them, else storage (then offered up)."""
        return self.fetch_from(index, 0, [])

    def fetch_from(self, index: int, start: int, missed: list[FetchTier], tally: bool = False) -> bytes:
        """Ask ``tiers[start:]``, then storage; offer the bytes to every tier that missed. ``tally``: as
        for :meth:`keep`."""
        raw = self.ask(index, self.tiers[start:], missed)
        return self.keep(index, raw, missed, tally) if raw is None else self._offer(index, raw, missed)

    def fetch_many(self, indices: Sequence[int], pool: Any = None, views: bool = False) -> list[Any]:
        """Raw bytes of each of ``indices``, in order: what this node's memory tiers hold is taken here,
        one item after another (a memory copy costs less than handing it to a thread); the rest are
        read through ``pool`` (an Executor: storage and remote tiers in parallel) when one is given.
        ``views``: a memory tier's answer is given as it is (a view of its row, valid while the cache is
        open), not copied into bytes (10-36 us per 90 KB item), for a caller that copies it anyway."""
        near = self.in_memory_tiers()
        in_memory = self.tiers[:near]
        out: list[Any] = [None] * len(indices)
        rest: list[tuple[int, int, list[FetchTier]]] = []
        for k, index in enumerate(indices):
            missed: list[FetchTier] = []
            raw = self.ask(index, in_memory, missed)
            if raw is None:
                rest.append((k, index, missed))
            else:
                out[k] = raw if views else as_bytes(raw)
        if pool is not None and len(rest) > 1:
            reads = [pool.submit(self.fetch_from, index, near, missed) for _k, index, missed in rest]
            for (k, _index, _missed), read in zip(rest, reads, strict=True):
                out[k] = read.result()
        else:
            for k, index, missed in rest:
                out[k] = self.fetch_from(index, near, missed)
        return out

    def keep(self, index: int, raw: bytes | None, missed: list[FetchTier], tally: bool = False) -> bytes:
        """A storage read of ``index`` (``raw``; None: read it now), counted and offered to ``missed``.

        ``tally``: counted with the batch being made (added at :meth:`end_batch`, by the thread that
        ends it: the caller's), not at once under the counters' lock (a read-ahead thread's way)."""
        if raw is None:
            raw = self.read_storage(index)
        if tally:
            counts = self._tally
            counts[2] += len(raw)
            counts[3] += 1
        else:
            self.counters.add_many({"storage_bytes_read": len(raw), "storage_items_read": 1})
        return self._offer(index, raw, missed)

    def _offer(self, index: int, raw: bytes | memoryview, missed: list[FetchTier]) -> bytes:
        for tier in missed:
            tier.offer(index, raw)
        return as_bytes(raw)

    def read_storage(self, index: int) -> bytes:
        """``source.fetch``, or ``source.fetch_uncached`` when this process's page-cache policy says so."""
        return self.source.fetch_uncached(index) if self.bypass() else self.source.fetch(index)

    def bypass(self) -> bool:
        """Whether this process reads storage past the page cache (:mod:`coordl.fetch.pagecache`)."""
        if self.page_cache == "use" or getattr(self.source, "fetch_uncached", None) is None:
            return False
        pid = PID[0]  # kept current across forks: no system call per read
        if self._page_policy is None or self._page_policy[0] != pid:
            # MinIO alone (partitioned: peers serve misses)
            tier = self.tiers[0] if len(self.tiers) == 1 else None
            minio = tier.cache if isinstance(tier, MinioTier) else None
            self._page_policy = (pid, PageCachePolicy(self.page_cache, minio, len(self.source)))
        return self._page_policy[1].bypass()

    def ask(
        self, index: int, tiers: Sequence[FetchTier], missed: list[FetchTier]
    ) -> bytes | memoryview | None:
        """The first of ``tiers`` to have ``index``'s bytes; each tier that missed is appended to ``missed``.

        A tier asked for the whole batch at once (:meth:`ask_batched`) answers from that answer, with no
        second request for an item it did not have.
        """
        for tier in tiers:
            answered = self._batch_answers.get(id(tier))
            if answered is not None and index in answered[1]:
                raw = answered[0].pop(index, None)
            else:
                raw = tier.get(index)
            if raw is not None:
                return raw
            missed.append(tier)
        return None

    def ask_batched(self, indices: list[int]) -> None:
        """Ask each tier that serves batches (``get_many``: the partitioned cache) for all of ``indices``
        in one go: a batch costs one round trip per peer, not one per item."""
        self._batch_answers = {}
        for tier in self.tiers:
            get_many = getattr(tier, "get_many", None)
            if callable(get_many):
                self._batch_answers[id(tier)] = (dict(get_many(indices)), frozenset(indices))

    def end_batch(self) -> None:
        """Drop what the batch's tiers answered and was not taken; count what :meth:`batch_fetch` read."""
        self._batch_answers = {}
        self.add_tally()

    def count_reads(self, items: int, nbytes: int = 0) -> None:
        """Count ``items`` storage reads of ``nbytes`` in all with the batch being made."""
        self._tally[2] += nbytes
        self._tally[3] += items

    def add_tally(self) -> None:
        """Add what the batch counted so far to the shared counters (:meth:`end_batch` does)."""
        tally = self._tally
        if tally[0] or tally[1] or tally[3]:
            counts = dict(zip(_TALLIED, tally, strict=True))
            tally[:] = [0, 0, 0, 0]
            self.counters.add_many({name: n for name, n in counts.items() if n})

    def batch_fetch(self, views: bool = False, asked: bool = False) -> Callable[[int], Any]:
        """:meth:`fetch` for the items of the batch being made, counted once at :meth:`end_batch`.

        For the chains nearly every loader has (no tier, or the loader's MinIO cache alone) a function
        that does that chain's work and nothing else: the cache's row read directly, storage read with
        the page-cache decision of this process, and the counts kept in this object until the batch
        ends instead of added to the shared counters (a lock) per item; the same counts, a batch later
        at most. Any other chain (a tier added by a profiler, the partitioned cache): :meth:`fetch`.
        Call it from the thread that ends the batch (a loader worker's own), not from read-ahead threads.
        ``views``: a cache hit is given as a view of its row (valid while the cache is open), not bytes.
        ``asked``: the MinIO cache was asked already and missed (:meth:`peek_memory`): storage, then the cache.
        """
        tiers = self.tiers
        source_fetch = self.source.fetch
        tally = self._tally
        if not tiers:
            read = self.source.fetch_uncached if self.bypass() else source_fetch

            def from_storage(index: int) -> bytes:
                raw = read(index)
                tally[2] += len(raw)
                tally[3] += 1
                return raw

            return from_storage
        if len(tiers) != 1 or type(tiers[0]) is not MinioTier or self._batch_answers:
            return self.fetch
        cache = tiers[0].cache
        get, put = cache.get, cache.put
        uncached = getattr(self.source, "fetch_uncached", None)
        bypass = self.bypass

        def missed(index: int) -> Any:
            data = uncached(index) if uncached is not None and bypass() else source_fetch(index)
            tally[2] += len(data)
            tally[3] += 1
            put(index, data)
            return as_bytes(data)

        def through_minio(index: int) -> Any:
            raw = get(index)
            if raw is not None:
                tally[0] += 1
                return raw if views else bytes(raw)
            tally[1] += 1
            return missed(index)

        return missed if asked else through_minio

    def peek_memory(self, indices: list[int], copy: bool = False) -> tuple[list[Any], int] | None:
        """For a chain of the loader's MinIO cache alone: a view of each item's row the cache holds (None
        where it misses) and the number of misses, counted as :meth:`batch_fetch` counts; else None.

        A batch the cache holds whole needs no read-ahead at all (:class:`coordl.fetch.ahead.FetchAhead`
        is given the answers, so no item is asked twice). Views, not copies: a batch of large items is
        copied one item at a time, as each is prepped. ``copy``: ``bytes`` instead, for a prep that reads
        bytes (one slice of the mapping, not a view and then its copy).
        """
        tiers = self.tiers
        if len(tiers) != 1 or type(tiers[0]) is not MinioTier or self._batch_answers:
            return None
        raws = tiers[0].cache.get_many(indices, copy=copy)
        misses = raws.count(None)
        self._tally[0] += len(raws) - misses
        self._tally[1] += misses
        return raws, misses

    def in_memory_tiers(self) -> int:
        """How many leading tiers answer from this node's memory (no network, no disk)."""
        n = 0
        while n < len(self.tiers) and getattr(self.tiers[n], "in_memory", False):
            n += 1
        return n

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_page_policy"] = None  # each process decides for itself
        return state


def as_bytes(raw: bytes | memoryview) -> bytes:
    """A cache view as bytes: one memcpy, and prep gets the type the protocol promises."""
    return raw if isinstance(raw, bytes) else bytes(raw)

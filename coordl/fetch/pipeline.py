"""The per-item path inside a loader worker: fetch through a chain of tiers, then prep.

``LoaderSource`` is the map-style torch ``Dataset`` that ``coordl.DataLoader`` hands to
``torch.utils.data.DataLoader``; torch's fetcher calls its batched ``__getitems__``. For each index it
asks the fetch tiers in order (MinIO cache, later a peer's cache), falls back to ``source.fetch``
(storage), offers the bytes to the tiers that missed, and preps them. Optionally the deterministic part
of prep is looked up in / stored to a sample cache (memcache) first.

What torch would hand the dataset, the dataset gets (:mod:`coordl.fetch.keys`): a key that is not an
item index goes to ``dataset[key]`` as it is, and a dataset run as one opaque stage that defines
``__getitems__`` gets each batch in one call.

Why this module is long: one item's way through a worker (tiers, storage, read-ahead, prep, the
sample cache, skipping) is one loop whose parts share the batch's state; split, each part would
need that state handed around.
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch.utils.data

from coordl.datasets.source import describe_item, is_index
from coordl.errors import CorruptItemError
from coordl.fetch.keys import DatasetKeys
from coordl.fetch.minio import MinioCache
from coordl.fetch.pace import ReadPace
from coordl.fetch.pagecache import PageCachePolicy, check_mode
from coordl.fetch.watch import WorkerWatch
from coordl.fileread.read import ReadAhead
from coordl.ring.output_buffers import lend
from shmem.counters import SharedCounters
from shmem.segment import Segment

__all__ = ["FetchTier", "MinioTier", "LoaderSource", "BASE_COUNTERS"]

log = logging.getLogger("coordl")

BASE_COUNTERS = (
    "cache_hits", "cache_misses", "storage_bytes_read", "storage_items_read", "items_loaded", "skipped_items",
)  # fmt: skip


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

    def stats(self) -> dict[str, int]:
        return self.cache.stats()


class LoaderSource(torch.utils.data.Dataset):
    """A torch Dataset running fetch tiers -> storage -> prep for an item source.

    Args:
        source: the item source (``len``, ``fetch``, ``prep``).
        tiers: fetch tiers, asked in order before storage.
        counters: shared counters holding at least :data:`BASE_COUNTERS`.
        on_error: "raise" or "skip" (drop items whose prep raises :class:`CorruptItemError`).
        sample_cache_tier: optional memcache tier (``get_many`` / ``put_many``) for split-prep sources.
        watch: optional worker table, updated with the item each worker is on.
        fetch_ahead: in a loader worker, items of the batch fetched ahead by background threads while
            the worker preps (0: fetch and prep in turn). ``source.fetch`` must be thread-safe.
        ring: the batch ring's collate (:class:`coordl.ring.writer.RingCollate`), or None: with it,
            samples are stacked into a ring slot as they are made.
        page_cache: whether storage reads go through the OS page cache: ``"auto"``, ``"use"`` or
            ``"bypass"`` (:mod:`coordl.fetch.pagecache`; only for sources with ``fetch_uncached``).
    """

    def __init__(
        self,
        source: Any,
        tiers: Sequence[FetchTier],
        counters: SharedCounters,
        *,
        on_error: str = "raise",
        sample_cache_tier: Any = None,
        watch: WorkerWatch | None = None,
        fetch_ahead: int = 0,
        ring: Any = None,
        page_cache: str = "auto",
    ) -> None:
        check_mode(page_cache)
        self.source = source
        self.tiers = list(tiers)
        self.counters = counters
        self.on_error = on_error
        self.sample_cache_tier = sample_cache_tier
        self.watch = watch
        self.ring = ring
        self._item_seeds: dict[int, int] = {}
        # tier id -> (its answers, the indices it was asked) for the batch being made
        self._batch_answers: dict[int, tuple[dict[int, Any], frozenset[int]]] = {}
        self.fetch_ahead = int(fetch_ahead)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pool_pid = -1
        self._pace: tuple[int, ReadPace] | None = None  # (pid, this process's pace)
        self._reader: tuple[int, ReadAhead] | None = None  # (pid, this process's read-ahead of local files)
        self.page_cache = page_cache
        self._page_policy: tuple[int, PageCachePolicy] | None = None  # (pid, this process's policy)
        # A source whose prep reads views (coordl's Decode first) preps a cached item straight from its
        # cache row: no copy of the item into bytes first (10-12 us per 90 KB item, 1% of a sample's prep).
        self._prep_views = getattr(source, "prep_reads_buffers", False) is True
        self._keys = DatasetKeys(source, counters, on_error)  # keys that are not indices; __getitems__
        # One flag byte per item, shared by all workers: a bad file is logged once, not once per
        # worker or epoch (non-persistent workers are new processes every epoch).
        self._skip_log = Segment.create("skiplog", len(source)) if on_error == "skip" else None
        if self._skip_log is not None:
            self._skip_log.reserve(0, self._skip_log.size)

    def __len__(self) -> int:
        return len(self.source)

    @property
    def user_dataset(self) -> Any:
        """The user's dataset these items are read from (behind coordl's adapters)."""
        return self._keys.dataset

    def __getitem__(self, index: Any) -> Any:
        if not is_index(
            index
        ):  # batch_size=None and a sampler of lists, slices, names...: torch's dataset[key]
            return self._keys.get(index)
        out = self._get_many([index], stack=False)
        if not out:
            # Only reachable without batching, which the loader refuses with on_error="skip".
            raise CorruptItemError(f"{describe_item(self.source, index)} was skipped", index=index)
        return out[0]

    def __getitems__(self, indices: Sequence[Any]) -> Any:
        if not all(is_index(i) for i in indices):
            return self._keys.get_many(indices)
        return self._get_many(indices, stack=True)

    def _get_many(self, indices: Sequence[int], stack: bool) -> Any:
        """The batch's samples (skipped ones left out), or, with the batch ring, the stacked batch."""
        worker = torch.utils.data.get_worker_info()
        worker_id = worker.id if worker is not None and self.watch is not None else None
        # Indices may carry the seed of their prep's random draws (coordl.resume.SeededIndex).
        self._item_seeds = {int(i): i.seed for i in indices if getattr(i, "seed", None) is not None}
        batched = self._load_batched(indices, worker_id) if self._keys.batched is not None and stack else None
        if (
            batched is not None and type(batched) is not list
        ):  # the dataset's own batch: collate gets it as is
            self.counters.add("items_loaded", len(indices))
            return batched
        stacker = self.ring.stacker(len(indices)) if stack and self.ring is not None else None
        if self.sample_cache_tier is None and batched is None:
            self._ask_batched([int(i) for i in indices])
        kept: list[Any] = []
        n_kept = n_skipped = 0
        try:
            if batched is not None:
                samples: Any = iter(batched)
            elif self.sample_cache_tier is not None:
                samples = self._load_split(indices, worker_id)
            elif self.fetch_ahead > 0 and worker is not None and len(indices) > 1:
                samples = self._load_ahead([int(i) for i in indices], worker_id)
            else:
                samples = (self._load_one(int(i), worker_id) for i in indices)
            # Transforms write each sample's tensor straight into its row of the slot (output_buffers).
            with lend(stacker.take if stacker is not None else None):
                for sample in samples:
                    if sample is _SKIPPED:
                        n_skipped += 1
                        continue
                    n_kept += 1
                    if stacker is None:
                        kept.append(sample)
                        continue
                    rest = stacker.add(sample)
                    if rest is not None:  # did not fit the slot's layout: plain samples from here on
                        kept, stacker = rest, None
        except BaseException:
            if stacker is not None:
                stacker.abort()  # the slot goes back to the ring
            raise
        finally:
            self._batch_answers = {}
            if worker_id is not None:
                self.watch.idle(worker_id)
        self.counters.add_many({"items_loaded": n_kept, "skipped_items": n_skipped})
        return stacker.finish() if stacker is not None else kept

    def _load_batched(self, indices: Sequence[int], worker_id: int | None) -> Any:
        """The dataset's ``__getitems__`` for the whole batch (its random draws follow the first item's
        seed), or None: with ``on_error="skip"`` a batch whose call raised CorruptItemError is loaded item
        by item, so that only the bad items are dropped."""
        keys = [int(i) for i in indices]
        if keys:
            self._seed(keys[0])
            if worker_id is not None:
                self.watch.on_item(worker_id, keys[0])
        try:
            return self._keys.batched(keys)
        except CorruptItemError:
            if self.on_error != "skip":
                raise
            return None

    # -- fetch -------------------------------------------------------------------------------------

    def fetch(self, index: int) -> bytes:
        """Raw bytes of ``index`` from the first tier that has them, else storage (then offered up)."""
        return self._fetch_from(index, 0, [])

    def _fetch_from(self, index: int, start: int, missed: list[FetchTier]) -> bytes:
        """Ask ``tiers[start:]``, then storage; offer the bytes to every tier that missed."""
        raw = self._ask(index, self.tiers[start:], missed)
        return self._keep(index, raw, missed) if raw is None else self._offer(index, raw, missed)

    def _keep(self, index: int, raw: bytes | None, missed: list[FetchTier]) -> bytes:
        """A storage read of ``index`` (``raw``; None: read it now), counted and offered to ``missed``."""
        if raw is None:
            raw = self._read_storage(index)
        self.counters.add_many({"storage_bytes_read": len(raw), "storage_items_read": 1})
        return self._offer(index, raw, missed)

    def _offer(self, index: int, raw: bytes | memoryview, missed: list[FetchTier]) -> bytes:
        for tier in missed:
            tier.offer(index, raw)
        return _as_bytes(raw)

    def _read_storage(self, index: int) -> bytes:
        """``source.fetch``, or ``source.fetch_uncached`` when this process's page-cache policy says so."""
        return self.source.fetch_uncached(index) if self._bypass() else self.source.fetch(index)

    def _bypass(self) -> bool:
        """Whether this process reads storage past the page cache (:mod:`coordl.fetch.pagecache`)."""
        if self.page_cache == "use" or getattr(self.source, "fetch_uncached", None) is None:
            return False
        pid = os.getpid()
        if self._page_policy is None or self._page_policy[0] != pid:
            tier = (
                self.tiers[0] if len(self.tiers) == 1 else None
            )  # MinIO alone (partitioned: peers serve misses)
            minio = tier.cache if isinstance(tier, MinioTier) else None
            self._page_policy = (pid, PageCachePolicy(self.page_cache, minio, len(self.source)))
        return self._page_policy[1].bypass()

    def _read_ahead_storage(self, index: int) -> Any:
        """The storage read of ``index`` started in a read-ahead thread: a handle with ``result()``.

        A source naming the local file it reads (``local_file``) has it read by native threads that
        never take the GIL (:class:`coordl.fileread.read.ReadAhead`); any other read runs its
        ``fetch`` in the Python pool.
        """
        local_file = getattr(self.source, "local_file", None)
        path = local_file(index) if local_file is not None else None
        if path is None:
            return self._fetch_pool().submit(self._read_storage, index)
        pid = os.getpid()
        if self._reader is None or self._reader[0] != pid:
            self._reader = (
                pid,
                ReadAhead(self.fetch_ahead),
            )  # one per process: threads do not survive a fork
        return self._reader[1].submit(path, cached=not self._bypass())

    def _ask(
        self, index: int, tiers: Sequence[FetchTier], missed: list[FetchTier]
    ) -> bytes | memoryview | None:
        """The first of ``tiers`` to have ``index``'s bytes; each tier that missed is appended to ``missed``.

        A tier asked for the whole batch at once (:meth:`_ask_batched`) answers from that answer, with no
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

    def _ask_batched(self, indices: list[int]) -> None:
        """Ask each tier that serves batches (``get_many``: the partitioned cache) for all of ``indices``
        in one go: a batch costs one round trip per peer, not one per item."""
        self._batch_answers = {}
        for tier in self.tiers:
            get_many = getattr(tier, "get_many", None)
            if callable(get_many):
                self._batch_answers[id(tier)] = (dict(get_many(indices)), frozenset(indices))

    def _in_memory_tiers(self) -> int:
        """How many leading tiers answer from this node's memory (no network, no disk)."""
        n = 0
        while n < len(self.tiers) and getattr(self.tiers[n], "in_memory", False):
            n += 1
        return n

    # -- prep --------------------------------------------------------------------------------------

    def _seed(self, index: int) -> None:
        """Seed torch's RNG for ``index``'s prep when its index carried a seed (resumable epochs)."""
        seed = self._item_seeds.get(index) if self._item_seeds else None
        if seed is not None:
            # The CPU generator only: torch.manual_seed also queues a seed for every accelerator
            # backend, formatting the call stack each time it is not initialised (0.5 ms per item,
            # a fifth of a sample's prep; measured in bench_loader's prep-bound run).
            torch.default_generator.manual_seed(seed)

    def _load_one(self, index: int, worker_id: int | None) -> Any:
        if worker_id is not None:
            self.watch.on_item(worker_id, index)
        try:
            raw = self.fetch(index)
            self._seed(index)
            return self.source.prep(raw, index)
        except CorruptItemError as e:
            return self._skip_or_raise(e, index)

    def _load_ahead(self, indices: list[int], worker_id: int | None) -> Iterator[Any]:
        """Prep each item while background threads read the next ``fetch_ahead`` ones from storage.

        A worker that fetches and preps in turn leaves its core idle during every storage read;
        with the reads in flight ahead of it, the core preps while the disk (or the network) works.
        Items a tier holds (a MinIO hit) are taken in this thread when their turn to be read ahead
        comes: handing a memory copy to a thread costs more than the copy, and every extra thread
        holding the GIL delays the prep thread each time it takes the GIL back (measured: +0.2-0.4 ms of
        worker CPU per sample, fully cached). So are storage reads while they block for only a few
        microseconds (the page cache): :class:`coordl.fetch.pace.ReadPace` decides. Results come back
        in the batch's order.
        """
        pending: collections.deque = collections.deque()
        todo = iter(indices)
        near = self._in_memory_tiers()
        pace = self._read_pace()

        def ahead(index: int) -> None:
            missed: list[FetchTier] = []
            raw = self._ask(index, self.tiers[:near], missed)
            if raw is None:
                if pace.inline():
                    raw = _Inline(missed)
                elif near == len(self.tiers):  # storage is next: the thread only reads, the rest is done here
                    raw = _Reading(self._read_ahead_storage(index), missed)
                else:
                    raw = self._fetch_pool().submit(self._fetch_from, index, near, missed)
            pending.append((index, raw))

        for index in itertools.islice(todo, self.fetch_ahead):
            ahead(index)
        try:
            while pending:
                index, raw = pending.popleft()
                nxt = next(todo, None)
                if nxt is not None:
                    ahead(nxt)
                if worker_id is not None:
                    self.watch.on_item(worker_id, index)
                try:
                    if type(raw) is _Inline:
                        data = pace.timed(lambda: self._fetch_from(index, near, raw.missed))  # noqa: B023 - called at once
                    elif type(raw) is _Reading:
                        data = self._keep(index, raw.read.result(), raw.missed)
                    else:
                        data = (
                            raw.result()
                            if isinstance(raw, concurrent.futures.Future)
                            else self._prep_input(raw)
                        )
                    self._seed(index)
                    yield self.source.prep(data, index)
                except CorruptItemError as e:
                    yield self._skip_or_raise(e, index)
        finally:
            for _index, raw in pending:
                if type(raw) is _Reading or isinstance(raw, concurrent.futures.Future):
                    (
                        raw.read if type(raw) is _Reading else raw
                    ).cancel()  # an error or a closed generator: reads not started are dropped

    def _prep_input(self, raw: bytes | memoryview) -> bytes | memoryview:
        """What prep is given for bytes a tier answered: the view itself where the source's prep reads views."""
        return raw if self._prep_views else _as_bytes(raw)

    def _fetch_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        pid = os.getpid()
        if self._pool is None or self._pool_pid != pid:
            # One pool per worker process (a forked copy of another process's pool has no threads).
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.fetch_ahead, thread_name_prefix="coordl-fetch"
            )
            self._pool_pid = pid
        return self._pool

    def _read_pace(self) -> ReadPace:
        """This worker process's :class:`ReadPace` (each process learns how fast its own reads are)."""
        if self._pace is None or self._pace[0] != os.getpid():
            self._pace = (os.getpid(), ReadPace())
        return self._pace[1]

    def _load_split(self, indices: Sequence[int], worker_id: int | None) -> Iterator[Any]:
        indices = [int(i) for i in indices]
        arrays = self.sample_cache_tier.get_many(indices)
        self._ask_batched([i for i in indices if i not in arrays])
        fresh = {}
        for index in indices:
            if worker_id is not None:
                self.watch.on_item(worker_id, index)
            try:
                arr = arrays.get(index)
                if arr is None:
                    arr = self.source.prep_deterministic(self.fetch(index), index)
                    fresh[index] = arr
                self._seed(index)
                sample = self.source.prep_random(arr, index)
            except CorruptItemError as e:
                sample = self._skip_or_raise(e, index)
            yield sample
        if fresh:
            self.sample_cache_tier.put_many(fresh)

    def _skip_or_raise(self, error: CorruptItemError, index: int) -> Any:
        if error.index is None:
            error.index = index
        if error.path is None:
            what = describe_item(self.source, index)
            if what != f"item {index}":
                error.path = what
        if self.on_error != "skip":
            raise error
        logged = self._skip_log.array(np.uint8, 0, len(self.source))
        if not logged[index]:
            logged[index] = 1
            log.warning("coordl: skipping %s: %s", error.path or f"item {index}", error)
        return _SKIPPED

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pool"], state["_pool_pid"], state["_pace"] = (
            None,
            -1,
            None,
        )  # threads do not cross into a spawned worker
        state["_page_policy"], state["_reader"] = None, None
        return state

    def close(self) -> None:
        """Free the skip log (the loader closes its counters, cache and worker table itself)."""
        if self._skip_log is not None:
            self._skip_log.close()

    def stats(self) -> dict[str, Any]:
        """Counters summed over all processes, plus each tier's own stats."""
        out: dict[str, Any] = dict(self.counters.snapshot())
        for tier in self.tiers:
            out.update(tier.stats())
        return out


_SKIPPED = object()


class _Inline:
    """A storage read left for the prep thread to make when the item's turn comes (fast storage)."""

    __slots__ = ("missed",)

    def __init__(self, missed: list[FetchTier]) -> None:
        self.missed = missed


class _Reading:
    """A storage read running ahead (a future or a ReadAhead handle); the prep thread counts it and offers
    it to the tiers that missed."""

    __slots__ = ("read", "missed")

    def __init__(self, read: Any, missed: list[FetchTier]) -> None:
        self.read = read
        self.missed = missed


def _as_bytes(raw: bytes | memoryview) -> bytes:
    # A cache view becomes bytes here: one memcpy, and prep gets the type the protocol promises.
    return raw if isinstance(raw, bytes) else bytes(raw)

"""Reading a batch's next items in background threads while a loader worker preps the one before.

A worker that fetches and preps in turn leaves its core idle during every storage read; with the reads
in flight ahead of it, the core preps while the disk (or the network) works. :class:`FetchAhead` keeps
``depth`` items in flight. Items a tier holds in memory (a MinIO hit) are taken in the prep thread when
their turn to be read ahead comes: handing a memory copy to a thread costs more than the copy, and every
extra thread holding the GIL delays the prep thread each time it takes the GIL back (measured: +0.2-0.4 ms
of worker CPU per sample, fully cached). So are storage reads while they block for only a few
microseconds (the page cache): :class:`coordl.fetch.pace.ReadPace` decides. Results come back in the
batch's order.

Threads do not survive a fork and are not pickled into a spawned worker: the thread pool, the native
read-ahead of local files and the read pace are made per process, on first use.
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import os
from collections.abc import Callable, Iterator
from typing import Any

from coordl.errors import CorruptItemError
from coordl.fetch.pace import ReadPace
from coordl.fetch.tiers import FetchTier, TierLookup, as_bytes
from coordl.fetch.watch import WorkerWatch
from coordl.fileread.read import ReadAhead

__all__ = ["FetchAhead"]


class FetchAhead:
    """A batch's items fetched ``depth`` ahead of their prep (see the module docstring).

    Args:
        depth: items in flight ahead of the one being prepped (also the number of threads).
        lookup: the tiers and storage the items come from; ``lookup.source.fetch`` must be thread-safe.
        prep_views: whether the source's prep reads views: a tier's answer is then given as it is, not
            copied into bytes first (10-12 us per 90 KB item, 1% of a sample's prep).
    """

    def __init__(self, depth: int, lookup: TierLookup, prep_views: bool) -> None:
        self.depth = depth
        self._lookup = lookup
        self.prep_views = prep_views
        self._pool: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = None  # (pid, its pool)
        self._reader: tuple[int, ReadAhead] | None = None  # (pid, its read-ahead of local files)
        self._pace: tuple[int, ReadPace] | None = None  # (pid, its pace)

    def load(
        self,
        indices: list[int],
        worker_id: int | None,
        watch: WorkerWatch | None,
        seed: Callable[[int], None],
        skip: Callable[[CorruptItemError, int], Any],
        known: list[Any] | None = None,
    ) -> Iterator[Any]:
        """Each item of ``indices`` prepped (``seed(index)`` first), in order; an item whose fetch or prep
        raised :class:`CorruptItemError` gives ``skip(error, index)`` instead. ``watch`` is told the item
        each worker is on. ``known``: what the in-memory tiers already answered for each item (the
        cache's view, or None where it missed: :meth:`~coordl.fetch.tiers.TierLookup.peek_memory`)."""
        lookup = self._lookup
        ask, keep, fetch_from, prep = lookup.ask, lookup.keep, lookup.fetch_from, lookup.source.prep
        pending: collections.deque = collections.deque()
        todo = iter(indices)
        near = lookup.in_memory_tiers()
        in_memory, whole = lookup.tiers[:near], near == len(lookup.tiers)
        pace = self.pace()
        answers = iter(known) if known is not None else None

        def ahead(index: int) -> None:
            missed: list[FetchTier] = []
            if answers is not None:  # asked already: every in-memory tier missed where it says None
                raw: Any = next(answers)
                if raw is None:
                    missed.extend(in_memory)
            else:
                raw = ask(index, in_memory, missed)  # bytes, or what stands for them until read
            if raw is None:
                if pace.inline():
                    raw = _Inline(missed)
                elif whole:  # storage is next: the thread only reads, the rest is done here
                    raw = _Reading(self._read_storage(index), missed)
                else:
                    raw = self._threads().submit(fetch_from, index, near, missed)
            pending.append((index, raw))

        for index in itertools.islice(todo, self.depth):
            ahead(index)
        try:
            while pending:
                index, raw = pending.popleft()
                nxt = next(todo, None)
                if nxt is not None:
                    ahead(nxt)
                if worker_id is not None and watch is not None:
                    watch.on_item(worker_id, index)
                try:
                    # reads made or finished in this thread are counted with the batch (TierLookup.end_batch)
                    if type(raw) is _Inline:
                        data = pace.timed(lambda: fetch_from(index, near, raw.missed, True))  # noqa: B023 - called at once
                    elif type(raw) is _Reading:
                        data = keep(index, raw.read.result(), raw.missed, True)
                    elif isinstance(raw, concurrent.futures.Future):
                        data = raw.result()
                    else:
                        data = raw if self.prep_views else as_bytes(raw)
                    seed(index)
                    yield prep(data, index)
                except CorruptItemError as e:
                    yield skip(e, index)
        finally:
            lookup.add_tally()  # the reads counted in this thread
            for _index, raw in pending:
                # an error or a closed generator: reads not started are dropped
                if type(raw) is _Reading:
                    raw.read.cancel()
                elif isinstance(raw, concurrent.futures.Future):
                    raw.cancel()

    def _read_storage(self, index: int) -> Any:
        """The storage read of ``index`` started in a read-ahead thread: a handle with ``result()``.

        A source naming the local file it reads (``local_file``) has it read by native threads that
        never take the GIL (:class:`coordl.fileread.read.ReadAhead`); any other read runs its
        ``fetch`` in the Python pool.
        """
        lookup = self._lookup
        local_file = getattr(lookup.source, "local_file", None)
        path = local_file(index) if local_file is not None else None
        if path is None:
            return self._threads().submit(lookup.read_storage, index)
        pid = os.getpid()
        if self._reader is None or self._reader[0] != pid:
            self._reader = (pid, ReadAhead(self.depth))
        return self._reader[1].submit(path, cached=not lookup.bypass())

    def _threads(self) -> concurrent.futures.ThreadPoolExecutor:
        pid = os.getpid()
        if self._pool is None or self._pool[0] != pid:
            pool = concurrent.futures.ThreadPoolExecutor(self.depth, thread_name_prefix="coordl-fetch")
            self._pool = (pid, pool)
        return self._pool[1]

    def pace(self) -> ReadPace:
        """This worker process's :class:`ReadPace` (each process learns how fast its own reads are)."""
        if self._pace is None or self._pace[0] != os.getpid():
            self._pace = (os.getpid(), ReadPace())
        return self._pace[1]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pool"] = state["_reader"] = state["_pace"] = (
            None  # threads do not cross into a spawned worker
        )
        return state


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

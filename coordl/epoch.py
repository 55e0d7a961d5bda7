"""One pass over a ``coordl.DataLoader``: the iterator the user gets, and the per-epoch statistics.

:class:`EpochIterator` drops batches whose every item was skipped, turns torch's worker-death and
timeout ``RuntimeError`` into coordl's errors, lets the caller go on after a batch's error as torch
does, unwraps batch-ring batches, and closes the epoch's statistics when the pass ends. :class:`EpochStats` turns counter snapshots into per-epoch deltas.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from coordl.errors import WorkerDiedError

if TYPE_CHECKING:
    from shmem.counters import SharedCounters

__all__ = ["EmptyBatch", "EpochIterator", "EpochStats", "LoaderStats", "SkipAwareCollate", "Sized"]


class EmptyBatch:
    """Stands for a batch whose every item was skipped (``on_error="skip"``); the loader drops it."""


class SkipAwareCollate:
    """Collates what survived skipping; a batch with nothing left becomes :class:`EmptyBatch`."""

    def __init__(self, collate_fn: Callable) -> None:
        self.collate_fn = collate_fn

    def __call__(self, batch: list[Any]) -> Any:
        return self.collate_fn(batch) if batch else EmptyBatch()


class EpochStats:
    """Per-epoch deltas of a loader's counters (``hit_ratio`` added), one entry per pass.

    Args:
        keys: the counter names an epoch entry reports.
    """

    def __init__(self, keys: tuple[str, ...]) -> None:
        self.keys = keys
        self.epochs: list[dict[str, Any]] = []
        self._start: dict[str, int] | None = None

    def begin(self, snapshot: dict[str, int]) -> None:
        self._start = {k: snapshot[k] for k in self.keys}

    def end(self, snapshot: dict[str, int], *, complete: bool) -> None:
        """Close the open epoch (no-op when none is open)."""
        if self._start is None:
            return
        delta: dict[str, Any] = {k: snapshot[k] - self._start[k] for k in self.keys}
        looked_up = delta["cache_hits"] + delta["cache_misses"]
        delta["hit_ratio"] = delta["cache_hits"] / looked_up if looked_up else 0.0
        delta["epoch"] = len(self.epochs)
        delta["complete"] = complete
        self.epochs.append(delta)
        self._start = None

    def reset(self) -> None:
        self.epochs.clear()
        self._start = None


class LoaderStats:
    """``stats()``, ``epoch_stats()`` and ``reset_stats()`` of coordl's loaders, written once.

    The loader that mixes this in sets ``dataset``, ``source``, ``_counters`` (shared counters),
    ``_epoch_stats`` (:class:`EpochStats`), ``_closed`` and ``_final_stats`` (the totals kept at
    ``close()``), and names in :meth:`_stat_parts` the parts that add keys of their own.
    """

    dataset: Any
    source: Any
    _counters: SharedCounters
    _epoch_stats: EpochStats
    _closed: bool
    _final_stats: dict[str, Any] | None

    def _stat_parts(self) -> tuple[Any, ...]:
        return ()

    def stats(self) -> dict[str, Any]:
        """Totals since construction (or :meth:`reset_stats`), counted across all workers."""
        if self._closed:
            return dict(self._final_stats or {})
        out: dict[str, Any] = {}
        for obj in (self.dataset, self.source):
            own = getattr(obj, "stats", None)
            if callable(own):
                out.update(own())
        out.update(self._counters.snapshot())
        for part in self._stat_parts():
            if part is not None:
                out.update(part.stats())
        return out

    def epoch_stats(self) -> list[dict[str, Any]]:
        """Per epoch (one entry per iteration over the loader): the counter deltas and ``hit_ratio``."""
        return [dict(e) for e in self._epoch_stats.epochs]

    def reset_stats(self) -> None:
        """Zero the counters and forget per-epoch numbers (call between epochs)."""
        self._counters.reset()
        self._epoch_stats.reset()
        for part in self._stat_parts():  # parts that count on their own (remote prep)
            reset = getattr(part, "reset_stats", None)
            if callable(reset):
                reset()


# torch's worker-death and timeout errors, and a queue connection reset by a worker killed mid-batch
_TRANSLATED = (RuntimeError, ConnectionError, EOFError)


class EpochIterator:
    """One pass: drops all-skipped batches, translates torch errors, ends the epoch at the end.

    Args:
        it: the underlying iterator (torch's, or the coordinated group's).
        translate: maps a ``RuntimeError`` (or a queue's ``ConnectionError``, ``EOFError``) of ``it`` to a
            coordl error, or None to re-raise it.
        unwrap: turns what ``it`` yields into the user's batch (the batch ring's views).
        on_end: called once when ``it`` is exhausted.
        on_batch: called after each batch handed to the user (counts batches for resumable state).
        on_error: called with ``it`` when it raised an error that ends the epoch (a worker died; see
            :meth:`_raise`): its workers can stop now.
    """

    def __init__(
        self,
        it: Any,
        *,
        translate: Callable[[Exception, Any], BaseException | None],
        unwrap: Callable[[Any], Any],
        on_end: Callable[[], None],
        on_batch: Callable[[], None],
        on_error: Callable[[Any], None] = lambda it: None,
    ) -> None:
        self._it = it
        self._on_error = on_error
        self._translate = translate
        self._unwrap = unwrap
        self._on_end = on_end
        self._on_batch = on_batch

    def __iter__(self) -> EpochIterator:
        return self

    def __next__(self) -> Any:
        while True:
            try:
                batch = next(self._it)
                if isinstance(batch, EmptyBatch):
                    continue
                self._on_batch()
                # inside the try too: torch's SIGCHLD handler raises a worker's death wherever this
                # process is, and here it is still coordl's to translate
                return self._unwrap(batch)
            except StopIteration:
                self._on_end()
                raise
            except Exception as e:
                self._raise(e)

    def _raise(self, error: Exception) -> None:
        """Raise ``error`` (or coordl's translation of a RuntimeError), leaving no cycle.

        As in torch, an exception raised by the dataset or collate in a worker reaches the caller for
        its batch only: the caller may catch it and call ``next`` again for the following batches
        (torch's own iterator is built for that). A worker that died ends the epoch: the underlying
        iterator is told (``on_error``), so its other workers stop now.

        torch re-raises a worker's exception from frames that hold the exception and the iterator; such
        a cycle keeps the iterator, and any worker processes, alive until the cyclic collector runs at
        some random later point (measured in CI: 5 s per worker, inside whatever allocation triggered
        the collection). The finished frames' locals are cleared (the printed traceback keeps every
        line), so the iterator goes as soon as nothing else holds it.
        """
        traceback.clear_frames(error.__traceback__)
        translated = self._translate(error, self._it) if isinstance(error, _TRANSLATED) else None
        if isinstance(translated, WorkerDiedError):
            self._on_error(self._it)
        try:
            if translated is None:
                raise error
            raise translated from error
        finally:
            del error, translated

    def __len__(self) -> int:
        return len(self._it)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this class lacks: torch's iterator's own (``_workers``,
        # ``_num_yielded``...), which tools and tests written for torch's iterator look at.
        it = self.__dict__.get("_it")
        if it is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(it, name)


class Sized:
    """An iterator with a length (the group's epoch generator, for ``len(iter(loader))``)."""

    def __init__(self, it: Iterator[Any], length: int) -> None:
        self._it, self._len = it, length

    def __iter__(self) -> Sized:
        return self

    def __next__(self) -> Any:
        return next(self._it)

    def __len__(self) -> int:
        return self._len

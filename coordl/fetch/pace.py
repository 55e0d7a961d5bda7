"""Whether a worker's next storage read is worth a read-ahead thread, decided from how long reads block.

A loader worker reads ahead of its prep (``fetch_ahead``): the next items' reads run in pool threads
while the worker preps, so its core does not idle while storage answers. That hand-off has a price of
its own: a future, a queue, a thread woken, and one more thread taking the GIL back after every read,
which delays the prep thread each time. Measured on the 2-core VM (2 persistent workers, 2000 JPEGs,
half of them read from files in the page cache, standard recipe with crop decode): 0.885 ms of CPU per
sample with the pool against 0.848 ms reading in the prep thread, and 4-5% more samples/s. A read that
the page cache answers blocks for a few microseconds, so overlapping it saves nothing and the pool
only costs. A read from a disk, a network file system or an object store blocks for 0.1-10 ms, and
then the pool is what keeps the core busy (session 6 of ``reports/bench_loader.md``: 9 points of the
decode limit with the loop device as storage).

:class:`ReadPace` times the reads made in the prep thread: how long each spent blocked (wall time less
the thread's CPU time). While the median of the last :data:`WINDOW` is below :data:`BLOCKED_LIMIT_S`
the worker reads in the prep thread when the item's turn comes. The median, not the mean: a read can
look blocked because the thread was preempted or waited for the GIL after the read, which happens to
some reads whatever the storage (with 2 workers and the main process on 2 cores, the mean of page-cache
reads measured 0.4-1 ms, their median a few microseconds); a slow store blocks every read. Otherwise
the reads go to the pool, and every so often one read is made in the prep thread again (a probe) to
see whether storage became fast (the page cache warming up in a dataset's second epoch), at a gap that
doubles while storage stays slow (so a slow store costs at most one stalled read in :data:`PROBE_MAX`).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["BLOCKED_LIMIT_S", "PROBE_FIRST", "PROBE_MAX", "WINDOW", "ReadPace"]

T = TypeVar("T")
A = TypeVar("A")

# A read that blocks for less than this is made in the prep thread: about what a pool hand-off costs
# the worker in CPU (0.04 ms per read, measured above), so below it overlapping the read saves less
# than it costs.
BLOCKED_LIMIT_S = 50e-6
PROBE_FIRST = 16  # reads sent to the pool first (and between probes) before one is timed in the prep thread
PROBE_MAX = 1024  # the most reads between probes while storage stays slow
WINDOW = 8  # reads made in the prep thread whose median blocked time decides


class ReadPace:
    """Decides, read by read, whether a worker's storage read runs in its prep thread or ahead in a pool.

    Starts with the pool (the first reads of an epoch are often cold), and probes after
    :data:`PROBE_FIRST` reads. Used from the prep thread only.

    Args:
        limit_s: a read that blocks less than this (on average) is made in the prep thread.
        wall, cpu: clocks (``time.perf_counter``, ``time.thread_time``); tests pass their own.
    """

    def __init__(
        self,
        limit_s: float = BLOCKED_LIMIT_S,
        wall: Callable[[], float] = time.perf_counter,
        cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        self.limit_s = limit_s
        self._wall, self._cpu = wall, cpu
        self._recent: collections.deque[float] = collections.deque(
            maxlen=WINDOW
        )  # blocked s, prep-thread reads
        self.slow = True  # reads go to the pool (between probes)
        self._gap = PROBE_FIRST
        self._until_probe = PROBE_FIRST
        self._probing = False  # a probe was decided and is not timed yet
        self._exact = False  # the last read took the limit or longer: time the next on the CPU clock too
        self._over = 0  # reads in the window that blocked for the limit or longer
        self.inline_reads = self.pooled_reads = 0

    def inline(self) -> bool:
        """Whether the next read is made in the prep thread (when its turn comes), not ahead in the pool."""
        if self.slow:
            if self._until_probe > 0 or self._probing:
                self._until_probe -= 1
                self.pooled_reads += 1
                return False
            # a probe: judged on its own, not with the slow reads before it
            self._recent.clear()
            self._over = 0
            self._probing = True
        self.inline_reads += 1
        return True

    def timed_call(self, read: Callable[[A], T], arg: A) -> T:
        """``read(arg)`` in this thread, timed as :meth:`timed` times it: a read the prep thread makes
        without asking :meth:`inline` first, while storage is fast
        (:meth:`coordl.fetch.loads.BatchLoads.plain`)."""
        self.inline_reads += 1
        exact = self._exact or self.slow
        cpu = self._cpu() if exact else 0.0
        wall = self._wall()
        try:
            return read(arg)
        finally:
            self._done(wall, cpu, exact)

    def timed(self, read: Callable[[], T]) -> T:
        """``read()`` in this thread, its blocked time counted.

        The thread's CPU clock is a system call (2 us on the 2-core VM, twice per read: more than a
        page-cache read of a small file costs) and is read only where it can change the decision: a
        read whose wall time stays under the limit blocked less than that, and its wall time is what
        is counted. After a read that took longer, reads are timed on both clocks (and a probe always
        is) until one takes less again; the first long read counts its whole wall time as blocked.
        """
        exact = self._exact or self.slow
        cpu = self._cpu() if exact else 0.0
        wall = self._wall()
        try:
            return read()
        finally:
            self._done(wall, cpu, exact)

    def _done(self, wall: float, cpu: float, exact: bool) -> None:
        elapsed = self._wall() - wall
        self._exact = elapsed >= self.limit_s
        self._record(max(0.0, elapsed - (self._cpu() - cpu)) if exact else elapsed)

    @property
    def blocked_s(self) -> float | None:
        """The median blocked time of the recent reads made in the prep thread (None before the first)."""
        if not self._recent:
            return None
        v = sorted(self._recent)  # statistics.median, without its per-call overhead (it runs per read)
        mid = len(v) // 2
        return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2

    def _record(self, blocked_s: float) -> None:
        recent, limit = self._recent, self.limit_s
        if len(recent) == WINDOW and recent[0] >= limit:
            self._over -= 1  # the read that leaves the window
        recent.append(blocked_s)
        self._over += blocked_s >= limit
        probe, self._probing = self._probing, False
        if self.slow and not probe:
            return  # a read decided before the switch to the pool: the next probe judges
        if not self.slow and self._over < (len(recent) + 1) // 2:
            return  # fewer than half the window at the limit: its median is under it, storage still fast
        blocked = self.blocked_s  # not None: a read was just recorded
        if blocked is not None and blocked < self.limit_s:
            self.slow, self._gap = False, PROBE_FIRST
            return
        if probe:  # storage still slow: wait longer before the next probe
            self._gap = min(2 * self._gap, PROBE_MAX)
        self.slow, self._until_probe = True, self._gap

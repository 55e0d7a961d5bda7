"""shmem.counters: totals over processes, including ones that exited."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest

from shmem.counters import SharedCounters


def _work(counters: SharedCounters, n: int) -> None:
    for _ in range(n):
        counters.add("hits")
    counters.add_many({"bytes": 10})


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_counts_from_children_are_summed(tmp_path, method):
    c = SharedCounters(["hits", "bytes"], directory=tmp_path)
    procs = [mp.get_context(method).Process(target=_work, args=(c, 100)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert c.snapshot() == {"hits": 300, "bytes": 30}
    c.close()


def test_rows_of_exited_processes_are_recycled_without_losing_counts(tmp_path):
    c = SharedCounters(["hits", "bytes"], directory=tmp_path)
    for _ in range(150):  # more processes than rows
        p = mp.get_context("fork").Process(target=_work, args=(c, 1))
        p.start()
        p.join(30)
    assert c.snapshot() == {"hits": 150, "bytes": 1500}
    c.reset()
    assert c.snapshot() == {"hits": 0, "bytes": 0}
    c.close()


def _count(counters: SharedCounters, done, n: int) -> None:
    for _ in range(n):
        counters.add("hits")
        done.value += 1  # after the add: when done reads d, at least d adds were made


def test_a_reset_while_a_worker_counts_is_never_undone(tmp_path):
    # reset() zeroed every row, and a worker's += on its own row could write its old count back:
    # stats after reset_stats() still held counts from before it. Now the rows are never written by
    # a reset: its totals become the zero that later snapshots subtract. The bound checked holds
    # whatever the timing: what a snapshot counts since a reset is at most the adds made after it.
    n = 200_000
    c = SharedCounters(["hits", "bytes"], directory=tmp_path)
    ctx = mp.get_context("fork")
    done = ctx.RawValue("q", 0)
    p = ctx.Process(target=_count, args=(c, done, n))
    p.start()
    try:
        resets = 0
        while done.value < n and p.is_alive():
            d = done.value
            c.reset()
            since = c.snapshot()["hits"]
            assert 0 <= since <= done.value + 1 - d
            resets += 1
        p.join(60)
        assert p.exitcode == 0 and resets > 0 and done.value == n
        c.reset()
        assert c.snapshot() == {"hits": 0, "bytes": 0}
        c.add("bytes", 7)
        assert c.snapshot() == {"hits": 0, "bytes": 7}
    finally:
        p.join(30)
        c.close()


def test_a_child_forked_after_the_parent_counted_counts_in_a_row_of_its_own(tmp_path):
    """The parent's row is claimed before the fork; the child must not add to it (its adds would be
    lost when the parent writes its own count back, and the row's owner would be wrong)."""
    c = SharedCounters(["hits", "bytes"], directory=tmp_path)
    c.add("hits", 5)
    p = mp.get_context("fork").Process(target=_work, args=(c, 100))
    p.start()
    p.join(30)
    assert p.exitcode == 0
    c.add("hits", 1)
    assert c.snapshot() == {"hits": 106, "bytes": 10}
    owners = {int(pid) for pid in c._table[1:, 0] if pid}
    assert owners == {os.getpid(), p.pid}
    c.close()

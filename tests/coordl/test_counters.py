"""shmem.counters: totals over processes, including ones that exited."""

from __future__ import annotations

import multiprocessing as mp

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

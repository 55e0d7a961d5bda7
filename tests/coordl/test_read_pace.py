"""ReadPace: a worker reads in its prep thread while storage reads do not block, ahead in threads while
they do (coordl/fetch/pace.py). Clocks are the test's own, so nothing here depends on the machine's speed."""

from __future__ import annotations

import os
import threading

import pytest

from coordl.errors import CorruptItemError
from coordl.fetch.pace import BLOCKED_LIMIT_S, PROBE_FIRST, PROBE_MAX, ReadPace
from coordl.fetch.pipeline import BASE_COUNTERS, LoaderSource
from shmem.counters import SharedCounters
from tests.coordl.ldr_sources import MemorySource


class StorageClock:
    """A source whose reads advance a wall clock by ``block_s`` (what a read blocks for); the CPU clock
    stands still. Records the thread each read ran in."""

    thread_safe_fetch = True

    def __init__(self, n: int, bad: tuple[int, ...] = ()) -> None:
        self.items = MemorySource(n, bad=bad)
        self.block_s = 0.0
        self.now = 0.0
        self.threads: dict[int, str] = {}  # the thread each item was (last) read in
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.items)

    def fetch(self, index: int) -> bytes:
        with self._lock:
            self.now += self.block_s
            self.threads[index] = threading.current_thread().name
        return self.items.fetch(index)

    def prep(self, raw: bytes, index: int):
        return self.items.prep(raw, index)

    def describe(self, index: int) -> str:
        return self.items.describe(index)


@pytest.fixture
def reader():
    made: list[tuple[LoaderSource, SharedCounters]] = []

    def make(source: StorageClock, fetch_ahead: int = 4) -> tuple[LoaderSource, ReadPace]:
        counters = SharedCounters(BASE_COUNTERS)
        ls = LoaderSource(source, [], counters, fetch_ahead=fetch_ahead)
        pace = ReadPace(wall=lambda: source.now, cpu=lambda: 0.0)
        ls._loads._ahead._pace = (os.getpid(), pace)
        made.append((ls, counters))
        return ls, pace

    yield make
    for ls, counters in made:
        ls.close()
        counters.close()


def _load(ls: LoaderSource, indices: list[int]) -> list[int]:
    return [int(t[0]) for t in ls._loads.ahead(indices, None)]


def _in_prep_thread(source: StorageClock) -> list[bool]:
    """Per item read, in index order: whether it was read in this (the prep) thread."""
    me = threading.current_thread().name
    return [source.threads[i] == me for i in sorted(source.threads)]


def test_reads_that_do_not_block_move_into_the_prep_thread(reader) -> None:
    source = StorageClock(200)
    ls, pace = reader(source)
    assert _load(ls, list(range(200))) == list(range(200))
    inline = _in_prep_thread(source)
    # The first reads go ahead to the pool, and so do the 4 decided while the probe after them is out;
    # the probe finds storage fast: every later read is made here.
    assert sum(not x for x in inline) == PROBE_FIRST + 4 == pace.pooled_reads
    assert inline == [False] * PROBE_FIRST + [True] + [False] * 4 + [True] * (200 - PROBE_FIRST - 5)
    assert pace.inline_reads == 200 - PROBE_FIRST - 4 and not pace.slow


def test_reads_that_block_stay_in_the_pool_with_rarer_and_rarer_probes(reader) -> None:
    source = StorageClock(600)
    source.block_s = 0.005  # 5 ms a read: a disk or a network file system
    ls, pace = reader(source)
    assert _load(ls, list(range(600))) == list(range(600))
    # probes after 16 reads, then 32, 64, 128, 256 more: 5 reads made in the prep thread out of 600
    assert pace.inline_reads == sum(_in_prep_thread(source)) == 5
    assert pace.slow and pace.blocked_s >= BLOCKED_LIMIT_S
    assert all(
        t.startswith("coordl-fetch") for t in source.threads.values() if t != threading.current_thread().name
    )


def test_probe_gap_is_bounded() -> None:
    pace = ReadPace(wall=iter(range(0, 10**6, 1)).__next__, cpu=lambda: 0.0)  # every read blocks 1 s
    inline = 0
    for _ in range(20 * PROBE_MAX):
        if pace.inline():
            inline += 1
            pace.timed(lambda: None)
    assert inline >= 20 * PROBE_MAX // (PROBE_MAX + 1) - 1  # at least one probe every PROBE_MAX reads


def test_storage_that_gets_fast_is_read_in_the_prep_thread_again(reader) -> None:
    # a dataset's first epoch from disk, the next from the page cache
    source = StorageClock(400)
    source.block_s = 0.005
    ls, pace = reader(source)
    assert _load(ls, list(range(100))) == list(range(100))
    assert pace.slow
    source.block_s = 0.0
    assert _load(ls, list(range(100, 400))) == list(range(100, 400))
    assert not pace.slow
    assert all(_in_prep_thread(source)[-200:])


def test_storage_that_gets_slow_goes_back_to_the_pool(reader) -> None:
    source = StorageClock(300)
    ls, pace = reader(source)
    assert _load(ls, list(range(100))) == list(range(100))
    assert not pace.slow
    source.block_s = 0.005
    assert _load(ls, list(range(100, 300))) == list(range(100, 300))
    assert pace.slow
    assert sum(_in_prep_thread(source)[-150:]) <= 3  # probes only, at a growing gap


def test_errors_of_a_read_in_the_prep_thread_are_those_of_a_pooled_one(reader) -> None:
    source = StorageClock(40, bad=(30,))
    ls, _pace = reader(source)
    with pytest.raises(CorruptItemError, match=r"mem://item-30\.bin"):
        _load(ls, list(range(40)))
    assert _in_prep_thread(source)[30]  # item 30 was read here, after the probe

    class Broken(StorageClock):
        def fetch(self, index: int) -> bytes:
            if index == 25:
                raise OSError("storage error reading item 25")
            return super().fetch(index)

    ls, pace = reader(Broken(40))
    with pytest.raises(OSError, match="storage error reading item 25"):
        _load(ls, list(range(40)))
    assert not pace.slow  # a failed read still counts as one that did not block

"""Fetch-ahead: a worker's reads run in background threads while it preps; results and errors as before."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest
import torch

import coordl
from coordl.errors import CorruptItemError, WorkerDiedError
from coordl.fetch.pipeline import BASE_COUNTERS, LoaderSource
from shmem.counters import SharedCounters
from tests.coordl.ldr_sources import MemorySource, item_bytes


class SlowFetchSource(MemorySource):
    """MemorySource whose fetch takes ``delay_s`` and records how many fetches overlap (across threads)."""

    thread_safe_fetch = True

    def __init__(self, n: int, delay_s: float = 0.02, meet: int = 0, **kw) -> None:
        super().__init__(n, **kw)
        self.delay_s, self.meet = delay_s, meet
        self.active = multiprocessing.Value("i", 0)
        self.peak = multiprocessing.Value("i", 0)

    def fetch(self, index: int) -> bytes:
        with self.active.get_lock():
            self.active.value += 1
            self.peak.value = max(self.peak.value, self.active.value)
        try:
            # meet: hold the read until that many are in flight at once (10 s at most), so whether
            # reads overlap does not hang on how the threads happen to be scheduled.
            deadline = time.monotonic() + 10
            while self.meet and self.peak.value < self.meet and time.monotonic() < deadline:
                time.sleep(0.001)
            time.sleep(self.delay_s)
            return super().fetch(index)
        finally:
            with self.active.get_lock():
                self.active.value -= 1


def _ids(loader) -> list[list[int]]:
    return [b[:, 0].tolist() for b in loader]


@pytest.mark.parametrize("persistent", [False, True])
def test_same_batches_in_the_same_order(persistent: bool) -> None:
    src = SlowFetchSource(37, delay_s=0.0)
    want = [list(range(i, min(i + 4, 37))) for i in range(0, 37, 4)]
    with coordl.DataLoader(
        src, batch_size=4, num_workers=2, fetch_ahead=3, persistent_workers=persistent
    ) as dl:
        assert _ids(dl) == want and _ids(dl) == want
        assert dl._torch.dataset.fetch_ahead == 3


def test_reads_overlap_in_a_worker_and_not_without_fetch_ahead() -> None:
    src = SlowFetchSource(16, delay_s=0.0, meet=2)
    with coordl.DataLoader(src, batch_size=8, num_workers=1, fetch_ahead=4) as dl:
        assert sum(len(b) for b in dl) == 16
    assert src.peak.value >= 2  # several reads of the batch were in flight at once
    src = SlowFetchSource(16, delay_s=0.05)
    with coordl.DataLoader(src, batch_size=8, num_workers=1, fetch_ahead=0) as dl:
        assert sum(len(b) for b in dl) == 16
    assert src.peak.value == 1


def test_default_follows_the_sources_declaration(tmp_path) -> None:
    from coordl.datasets.synth import make_dataset

    root = make_dataset(tmp_path / "imgs", n=4, classes=2, width=32, height=24, workers=1)
    with coordl.DataLoader(coordl.ImageFolder(str(root)), batch_size=2, num_workers=1) as dl:
        assert dl._torch.dataset.fetch_ahead == coordl.dataloader.DEFAULT_FETCH_AHEAD
    with coordl.DataLoader(MemorySource(4), batch_size=2, num_workers=1) as dl:
        assert dl._torch.dataset.fetch_ahead == 0  # fetch not declared thread-safe: one at a time
    with pytest.raises(ValueError, match="fetch_ahead"):
        coordl.DataLoader(MemorySource(4), fetch_ahead=-1)


def test_corrupt_items_raise_or_skip_as_without_it() -> None:
    src = SlowFetchSource(20, delay_s=0.0, bad=(5, 6, 9))
    dl = coordl.DataLoader(src, batch_size=4, num_workers=2, fetch_ahead=4)
    with dl, pytest.raises(CorruptItemError, match=r"mem://item-5\.bin"):
        list(dl)
    with coordl.DataLoader(src, batch_size=4, num_workers=2, fetch_ahead=4, on_error="skip") as dl:
        assert _ids(dl)[:3] == [[0, 1, 2, 3], [4, 7], [8, 10, 11]]
        assert dl.stats()["skipped_items"] == 3


def test_a_failing_read_raises_its_own_error() -> None:
    class Broken(SlowFetchSource):
        def fetch(self, index: int) -> bytes:
            if index == 6:
                raise OSError(f"storage error reading item {index}")
            return super().fetch(index)

    dl = coordl.DataLoader(Broken(12, delay_s=0.0), batch_size=4, num_workers=2, fetch_ahead=4)
    with dl, pytest.raises(OSError, match="storage error reading item 6"):
        list(dl)


@pytest.mark.timeout(60)
def test_killed_worker_names_the_item_it_was_prepping() -> None:
    src = SlowFetchSource(40, delay_s=0.0, kill=13)
    dl = coordl.DataLoader(src, batch_size=4, num_workers=2, fetch_ahead=4)
    with dl, pytest.raises(WorkerDiedError, match=r"mem://item-13\.bin"):
        list(dl)


def test_cache_counts_stay_exact_with_threads() -> None:
    src = SlowFetchSource(64, delay_s=0.0, size=1000)
    with coordl.DataLoader(
        src, batch_size=8, num_workers=2, fetch_ahead=4, shuffle=True, cache_bytes=32 * 1000
    ) as dl:
        for _ in range(3):
            assert sum(len(b) for b in dl) == 64
        epochs = dl.epoch_stats()
    assert [e["storage_items_read"] for e in epochs] == [64, 32, 32]
    assert [e["cache_hits"] for e in epochs] == [0, 32, 32]
    assert all(e["items_loaded"] == 64 for e in epochs)
    assert torch.tensor([e["cache_hits"] + e["cache_misses"] for e in epochs]).eq(64).all()


class _RecordingTier:
    """A fetch tier holding ``have``; records the thread each lookup ran in and what it was offered."""

    def __init__(self, name: str, have: set[int], in_memory: bool) -> None:
        self.name, self.have, self.in_memory = name, have, in_memory
        self.threads: list[str] = []
        self.offered: list[int] = []
        self.offered_in: list[str] = []

    def get(self, index: int):
        self.threads.append(threading.current_thread().name)
        return item_bytes(index) if index in self.have else None

    def offer(self, index: int, raw) -> None:
        self.offered.append(index)
        self.offered_in.append(threading.current_thread().name)

    def stats(self) -> dict[str, int]:
        return {}


def test_in_memory_hits_are_taken_in_the_prep_thread_and_the_rest_in_read_threads() -> None:
    # Handing a memory copy to a thread costs more than the copy (and GIL hand-offs slow the prep
    # thread): only what needs I/O (a peer, storage) goes to the read-ahead threads.
    near = _RecordingTier("near", set(range(0, 4)), in_memory=True)
    far = _RecordingTier("far", set(range(4, 8)), in_memory=False)
    src = SlowFetchSource(12, delay_s=0.0)
    stored: list[str] = []
    fetch = src.fetch
    src.fetch = lambda i: stored.append(threading.current_thread().name) or fetch(i)
    counters = SharedCounters(BASE_COUNTERS)
    ls = LoaderSource(src, [near, far], counters, fetch_ahead=3)
    try:
        got = [int(t[0]) for t in ls._loads.ahead(list(range(12)), None)]
        assert got == list(range(12))
        assert set(near.threads) == {threading.current_thread().name} and len(near.threads) == 12
        assert len(far.threads) == 8 and all(t.startswith("coordl-fetch") for t in far.threads)
        assert len(stored) == 4 and all(t.startswith("coordl-fetch") for t in stored)
        assert sorted(near.offered) == list(range(4, 12)) and sorted(far.offered) == list(range(8, 12))
        assert counters.snapshot()["storage_items_read"] == 4
    finally:
        ls.close()
        counters.close()


def test_with_only_memory_tiers_a_read_thread_only_reads_storage() -> None:
    # The thread's work is the read alone: counting it and offering its bytes to the cache are done
    # when the prep thread takes the item (no Python beside the read in the thread, fewer GIL hand-offs).
    near = _RecordingTier("near", set(range(0, 4)), in_memory=True)
    src = SlowFetchSource(12, delay_s=0.0)
    stored: list[str] = []
    fetch = src.fetch
    src.fetch = lambda i: stored.append(threading.current_thread().name) or fetch(i)
    counters = SharedCounters(BASE_COUNTERS)
    ls = LoaderSource(src, [near], counters, fetch_ahead=3)
    try:
        got = [int(t[0]) for t in ls._loads.ahead(list(range(12)), None)]
        assert got == list(range(12))
        assert len(stored) == 8 and all(
            t.startswith("coordl-fetch") for t in stored
        )  # the pace starts pooled
        assert sorted(near.offered) == list(range(4, 12))
        assert set(near.offered_in) == {threading.current_thread().name}
        assert counters.snapshot()["storage_items_read"] == 8
        assert counters.snapshot()["storage_bytes_read"] == sum(len(item_bytes(i)) for i in range(4, 12))
    finally:
        ls.close()
        counters.close()


def test_a_read_thread_error_is_raised_for_its_item_and_later_reads_are_dropped() -> None:
    near = _RecordingTier("near", set(), in_memory=True)
    src = SlowFetchSource(12, delay_s=0.0)
    fetch = src.fetch

    def failing(i: int) -> bytes:
        if i == 5:
            raise OSError(f"disk error reading item {i}")
        return fetch(i)

    src.fetch = failing
    counters = SharedCounters(BASE_COUNTERS)
    ls = LoaderSource(src, [near], counters, fetch_ahead=3)
    try:
        got: list[int] = []
        with pytest.raises(OSError, match="item 5"):
            for t in ls._loads.ahead(list(range(12)), None):
                got.append(int(t[0]))
        assert got == [0, 1, 2, 3, 4]
        assert sorted(near.offered) == [0, 1, 2, 3, 4]  # nothing offered for the failed item
    finally:
        ls.close()
        counters.close()


class _BatchTier:
    """A tier that answers a whole batch at once (like the partitioned cache) and holds even items."""

    name = "batched"

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.single_gets = 0

    def get_many(self, indices):
        self.batches.append(list(indices))
        return {i: item_bytes(i) for i in indices if i % 2 == 0}

    def get(self, index):
        self.single_gets += 1
        return None

    def offer(self, index, raw) -> None:
        pass

    def stats(self):
        return {}


@pytest.mark.parametrize("fetch_ahead", [0, 3])
def test_a_batch_tier_is_asked_once_per_batch_never_per_item(fetch_ahead: int) -> None:
    tier = _BatchTier()
    source = MemorySource(16)
    with coordl.DataLoader(source, batch_size=4, fetch_ahead=fetch_ahead) as dl:
        dl.add_fetch_tier(tier)
        out = torch.cat([b[:, 0] for b in dl])
        stats = dl.stats()
    assert out.tolist() == list(range(16))
    assert tier.batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert tier.single_gets == 0  # a miss in the batch's answer is not asked again
    assert stats["storage_items_read"] == 8  # the odd items

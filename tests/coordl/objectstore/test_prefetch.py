"""Shards fetched ahead of use: the plan's order, the byte budget, a server dying mid-fetch, close().

Behaviour only, never timing: each test waits on what the buffer holds (with a generous deadline), not on sleeps.
"""

from __future__ import annotations

import gc
import glob
import os
import threading
import time

import pytest

import coordl
from coordl.objectstore import ObjectStore, StoreUnavailableError
from coordl.objectstore.shards import ShardBuffer
from tests.coordl.objectstore.conftest import BUCKET, N_ITEMS


def _ident(raw: bytes) -> bytes:
    return raw


def _until(cond, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout_s:g} s: {what}")
        time.sleep(0.005)


def _ahead_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "coordl-shard-ahead" and t.is_alive()]


class _Recorder:
    """A fetch that records (thread name, shard) and checks the byte bound as each GET starts."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes, self.log, self.buffer, self.over = sizes, [], None, []

    def __call__(self, name: str) -> bytes:
        me = threading.current_thread().name
        if me == "coordl-shard-ahead":
            held = sum(self.buffer.ahead().values()) + self.sizes[name]
            if held > self.buffer.ahead_bytes:
                self.over.append((name, held))
        self.log.append((me, name))
        return bytes(self.sizes[name])


def test_fetches_ahead_in_order_within_the_byte_budget():
    sizes = {n: 10 for n in "abcde"}
    rec = _Recorder(sizes)
    buf = rec.buffer = ShardBuffer(rec, max_shards=2, ahead_bytes=25, sizes=sizes)
    try:
        buf.want(["a", "b", "c", "d", "e"])
        _until(lambda: set(buf.ahead()) == {"a", "b"}, "a and b fetched ahead")
        assert buf.get("a") == bytes(10)  # read: it leaves the ahead budget, so c fits
        _until(lambda: set(buf.ahead()) == {"b", "c"}, "c fetched ahead after a was read")
        assert [n for _, n in rec.log] == ["a", "b", "c"]  # d never fits while b and c wait unread
        assert all(t == "coordl-shard-ahead" for t, _ in rec.log) and not rec.over
        buf.get("b")
        buf.get("c")  # from memory: no second GET
        _until(lambda: set(buf.ahead()) == {"d", "e"}, "d and e fetched ahead")
        assert [n for _, n in rec.log] == ["a", "b", "c", "d", "e"] and not rec.over
    finally:
        buf.close()
    assert not _ahead_threads()


def test_a_local_shard_is_never_fetched_ahead_and_a_stale_plan_gives_way():
    sizes = {n: 10 for n in "abcd"}
    rec = _Recorder(sizes)
    buf = rec.buffer = ShardBuffer(
        rec, max_shards=2, ahead_bytes=20, sizes=sizes, is_local=lambda n: n == "b"
    )
    try:
        buf.want(["a", "b", "c"])
        _until(lambda: set(buf.ahead()) == {"a", "c"}, "a and c (b is local)")
        buf.want(["d"])  # the next epoch's plan: a and c were never read; they make room for d
        _until(lambda: "d" in buf.ahead(), "d fetched in place of the stale ones")
        assert [n for _, n in rec.log] == ["a", "c", "d"] and not rec.over
    finally:
        buf.close()


def test_the_shard_being_reached_is_never_dropped_for_the_next_one():
    """The reader names the shard it reaches first (before reading it): fetched ahead, it is kept, not refetched."""
    sizes = {n: 10 for n in "abc"}
    rec = _Recorder(sizes)
    buf = rec.buffer = ShardBuffer(rec, max_shards=2, ahead_bytes=20, sizes=sizes)
    try:
        buf.want(["a", "b", "c"])
        _until(lambda: set(buf.ahead()) == {"a", "b"}, "a and b fetched ahead")
        buf.want(["b", "c"])  # the reader reached b: a (never read) gives way to c, b stays
        _until(lambda: set(buf.ahead()) == {"b", "c"}, "c fetched in place of a")
        assert buf.get("b") == bytes(10)
        assert [n for _, n in rec.log] == ["a", "b", "c"] and not rec.over
    finally:
        buf.close()


def test_a_window_read_out_of_order_keeps_its_earlier_shard():
    """Samples of a window interleave: reading d before c must not make c (fetched ahead, unread) give way."""
    sizes = {n: 10 for n in "cdef"}
    rec = _Recorder(sizes)
    buf = rec.buffer = ShardBuffer(rec, max_shards=4, ahead_bytes=20, sizes=sizes)
    try:
        buf.want(["c", "d", "e", "f"])
        _until(lambda: set(buf.ahead()) == {"c", "d"}, "c and d fetched ahead")
        buf.get("d")
        _until(lambda: set(buf.ahead()) == {"c", "e"}, "e fetched ahead, c kept")
        buf.get("c")
        assert [n for _, n in rec.log] == ["c", "d", "e"] and not rec.over
    finally:
        buf.close()


def _streamed(s3, packed, **kw) -> coordl.TarShards:
    name = os.path.basename(packed["pattern"])
    return coordl.TarShards(f"s3://{BUCKET}/shards/{name}", transform=_ident, storage_options=s3.storage_options(),
                            **kw)  # fmt: skip


def _plan_order(ds: coordl.TarShards, sampler: coordl.ShardSampler) -> list[str]:
    shards = []
    for i in sampler:
        name = ds.shards[int(ds._shard_of[i])]
        if name not in shards:
            shards.append(name)
    return shards


def test_the_sampler_plan_drives_the_gets_in_its_order(s3, packed):
    ds = _streamed(s3, packed, memory_shards=2)
    sampler = coordl.ShardSampler(ds, window=1, seed=3)
    expected = _plan_order(ds, sampler)
    sampler.set_epoch(0)
    rec, fetched_ahead = [], threading.Event()
    fetch = ds._files.buffer.fetch

    def recorded(name: str) -> bytes:
        me = threading.current_thread().name
        if me == "coordl-shard-ahead":
            fetched_ahead.set()
        elif name != expected[0]:  # the reader waits for the thread's first GET: no race decides who fetches
            assert fetched_ahead.wait(30)
        rec.append((me, name))
        return fetch(name)

    ds._files.buffer.fetch = recorded
    try:
        before = ds.stats()["store_requests"]
        got = [ds[i] for i in sampler]
        requests = ds.stats()["store_requests"] - before
    finally:
        ds.close()
    local = coordl.TarShards(packed["pattern"], transform=_ident)
    assert sorted(got) == sorted(local[i] for i in range(N_ITEMS))
    assert sorted(n for _, n in rec) == sorted(expected) and requests == len(expected)  # each shard once
    ahead = [expected.index(n) for t, n in rec if t == "coordl-shard-ahead"]
    assert ahead and ahead == sorted(ahead) and ahead[-1] >= 1  # in the plan's order, beyond the first shard
    assert not _ahead_threads()


def test_with_workers_every_shard_is_fetched_once_and_nothing_leaks(s3, packed):
    ds = _streamed(s3, packed, memory_shards=2)
    sampler = coordl.ShardSampler(ds, window=2, seed=1, batch_size=4, num_workers=2)
    segment = sampler.plan._segment.path
    assert os.path.exists(segment)
    loader = coordl.DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2, collate_fn=lambda b: b)
    try:
        for _ in range(2):
            before = loader.stats()["store_requests"]
            seen = sorted(x for b in loader for x in b)
            requests = loader.stats()["store_requests"] - before
            assert seen == sorted(
                coordl.TarShards(packed["pattern"], transform=_ident)[i] for i in range(N_ITEMS)
            )
            # one GET per shard, but for the epoch's tail, where batches may cross workers
            assert requests <= len(ds.shards) + 2
    finally:
        loader.close()
        ds.close()
    del loader, sampler, ds
    gc.collect()
    assert not os.path.exists(segment)
    assert not glob.glob(f"/dev/shm/coordl-shardplan-{os.getpid()}-*")


def test_a_server_killed_mid_fetch_ahead_is_an_error_naming_the_key_and_nothing_half_kept(
    image_root, tmp_path
):
    from coordl.packing.pack import pack
    from tests.support.s3server import S3Server, s3server_missing_reason

    if s3server_missing_reason():
        pytest.skip(s3server_missing_reason())
    out = tmp_path / "shards"
    tar = pack(coordl.ImageFolder(image_root), str(out), "tar", shard_mb=0.01, progress=False)
    with S3Server() as srv:
        srv.create_bucket(BUCKET)
        srv.upload_dir(out, BUCKET, "shards")
        stage = tmp_path / "stage"
        ds = coordl.TarShards(f"s3://{BUCKET}/shards/{os.path.basename(tar.pattern)}", transform=_ident,
                              storage_options=srv.storage_options(), stage_dir=stage)  # fmt: skip
        store: ObjectStore = ds._files.bucket.store
        store.attempts, store.backoff_s = 3, 0.05
        sampler = coordl.ShardSampler(ds, window=1, seed=0)
        order = list(sampler)
        sampler.set_epoch(0)
        first, second = (ds.shards[int(ds._shard_of[order[0]])], _plan_order(ds, sampler)[1])
        started, go = threading.Event(), threading.Event()
        fetch = ds._files.buffer.fetch

        def gated(name: str) -> bytes:
            if threading.current_thread().name == "coordl-shard-ahead" and name != first:
                started.set()
                go.wait(30)
            return fetch(name)

        ds._files.buffer.fetch = gated
        try:
            assert ds[order[0]]  # shard `first` read; the thread starts on `second` and waits at the gate
            assert started.wait(30)
            srv.kill()
            go.set()
            nxt = next(i for i in order if ds.shards[int(ds._shard_of[i])] == second)
            with pytest.raises(
                StoreUnavailableError, match=rf"s3://{BUCKET}/shards/{second}: GET failed after 3"
            ):
                ds[nxt]
            assert second not in ds._files.buffer.ahead()
        finally:
            ds.close()
        staged = {p.name for p in stage.rglob("*") if p.is_file()}
        assert not any(second in n for n in staged)  # no partial copy of the shard that failed
        assert first != second


def test_fetch_ahead_overlaps_the_gets_of_loose_files(s3, tmp_path, monkeypatch):
    """coordl.DataLoader(fetch_ahead=4) keeps several GETs in flight in each worker (fetch is thread-safe)."""
    log = str(tmp_path / "inflight.log")
    real = ObjectStore.get
    lock = threading.Lock()
    inflight = [0]

    def slow_get(self, key):  # a far store: each GET holds its thread 0.2 s
        with lock:
            inflight[0] += 1
            with open(log, "a") as f:
                f.write(f"{os.getpid()} {inflight[0]}\n")
        try:
            time.sleep(0.2)
            return real(self, key)
        finally:
            with lock:
                inflight[0] -= 1

    monkeypatch.setattr(ObjectStore, "get", slow_get)
    ds = coordl.ImageFolder("s3://data/train", transform=_ident, storage_options=s3.storage_options())
    with coordl.DataLoader(ds, batch_size=8, num_workers=2, fetch_ahead=4, collate_fn=lambda b: b,
                           multiprocessing_context="fork") as loader:  # fmt: skip
        assert sum(len(b) for b in loader) == N_ITEMS
    peaks: dict[str, int] = {}
    with open(log) as f:
        for line in f:
            pid, n = line.split()
            peaks[pid] = max(peaks.get(pid, 0), int(n))
    assert str(os.getpid()) not in peaks  # the workers fetched
    assert len(peaks) == 2 and all(p >= 2 for p in peaks.values()), peaks


def test_locals_last_moves_staged_shards_to_the_end_of_a_stream():
    from coordl.packed.shard_sampler import locals_last

    assert locals_last([5, 1, 7, 2, 9], {1, 2}, 2) == [5, 9, 7, 2, 1]
    assert locals_last([5, 1, 7], set(), 2) == [5, 1, 7]
    assert locals_last([1, 2], {1}, 2) == [1, 2]  # no remote shard before the tail to swap with


def test_from_epoch_2_the_tail_that_workers_share_is_read_from_staged_shards(s3, packed, tmp_path):
    name = os.path.basename(packed["pattern"])
    sizes = [
        os.path.getsize(os.path.join(packed["local"], "shards", n))
        for n in sorted(os.listdir(os.path.join(packed["local"], "shards")))
        if n.endswith(".tar")
    ]
    ds = coordl.TarShards(f"s3://{BUCKET}/shards/{name}", transform=_ident, storage_options=s3.storage_options(),
                          stage_dir=tmp_path / "stage", stage_budget_bytes=sum(sizes) // 2)  # fmt: skip
    sampler = coordl.ShardSampler(ds, window=2, seed=5, batch_size=3, num_workers=2)
    loader = coordl.DataLoader(ds, batch_size=3, sampler=sampler, num_workers=2, collate_fn=lambda b: b)
    try:
        for epoch in range(3):
            before = loader.stats()["store_requests"]
            assert sum(len(b) for b in loader) == N_ITEMS
            if epoch:  # every shard not staged, once: none twice
                assert loader.stats()["store_requests"] - before == len(ds.shards) - len(ds.local_shards())
    finally:
        loader.close()
        ds.close()


class _Uneven:
    """Shards of 7, 3, 9, 4, 8, 5, 6, 2 samples; ``staged`` of them local."""

    def __init__(self, staged: set[int]) -> None:
        counts = [7, 3, 9, 4, 8, 5, 6, 2]
        starts = [sum(counts[:i]) for i in range(len(counts) + 1)]
        self.ranges = list(zip(starts[:-1], starts[1:], strict=True))
        self.staged = staged

    def shard_ranges(self):
        return self.ranges

    def local_shards(self):
        return sorted(self.staged)

    def shard_of(self, i: int) -> int:
        return next(s for s, (a, b) in enumerate(self.ranges) if a <= i < b)


@pytest.mark.parametrize("seed", range(8))
def test_no_remote_shard_is_read_by_two_workers_when_staged_ones_can_take_the_tail(seed):
    staged = {0, 2, 4, 6}
    ds = _Uneven(staged)
    batch, workers = 2, 2
    order = list(coordl.ShardSampler(ds, window=2, seed=seed, batch_size=batch, num_workers=workers))
    readers: dict[int, set[int]] = {}
    for j in range(0, len(order), batch):  # torch: batch j goes to worker j % workers
        for i in order[j : j + batch]:
            readers.setdefault(ds.shard_of(i), set()).add((j // batch) % workers)
    assert sorted(order) == list(range(44))
    assert all(len(readers[s]) == 1 for s in readers if s not in staged), readers


def test_a_sample_of_another_workers_shard_is_one_ranged_get(s3, packed, monkeypatch):
    """The epoch's tail: a worker reading a sample of another worker's stream fetches that sample, not the shard."""
    import types

    import torch.utils.data

    ds = _streamed(s3, packed)
    sampler = coordl.ShardSampler(ds, window=1, seed=0, batch_size=2, num_workers=2)
    list(sampler)  # publishes epoch 0's two streams
    sampler.plan.locate(0)
    streams = sampler.plan._streams
    mine, theirs = streams[0][0], streams[1][0]
    monkeypatch.setattr(
        torch.utils.data, "get_worker_info", lambda: types.SimpleNamespace(id=0, num_workers=2)
    )
    try:
        before = ds.stats()
        ranges = ds.shard_ranges()
        sample = ranges[theirs][0]
        assert ds[sample] == coordl.TarShards(packed["pattern"], transform=_ident)[sample]
        after = ds.stats()
        assert after["store_requests"] - before["store_requests"] == 1
        assert after["store_bytes"] - before["store_bytes"] == int(
            ds._sizes[sample]
        )  # the sample's bytes only
        assert not ds._files.buffer.holds(ds.shards[theirs])
        ds[ranges[mine][0]]  # its own shard: fetched whole
        assert ds._files.buffer.holds(ds.shards[mine])
    finally:
        ds.close()


def test_a_plan_republished_for_the_same_epoch_is_never_read_half_old():
    from coordl.packed.shard_sampler import ShardPlan

    plan = ShardPlan(6, 2)
    assert plan.locate(0) is None  # nothing published
    plan.publish(3, [[0, 1, 2], [3, 4, 5]])
    assert plan.locate(4) == (3, 1, 1)
    # set_epoch(3) again with other local shards: the same epoch number, another plan.
    plan._count[0] += 1  # a publish caught half way: the epoch word still says 3
    plan._table[0] = 3
    assert plan.locate(4) is None  # ignored while written, not the cached old plan
    plan._count[0] += 1
    plan.publish(3, [[5, 4], [3, 2, 1, 0]])
    assert plan.locate(4) == (3, 0, 1) and plan.locate(0) == (3, 1, 3)

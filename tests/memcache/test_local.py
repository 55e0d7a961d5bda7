"""LocalStore: sharing across processes, MinIO fill-then-stop, refusing bad values, no leaked files."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import sys

import numpy as np
import pytest

from memcache import LocalStore
from memcache.local import _FILE_PREFIX, reclaim_stale_stores


def _img(i: int, size: int = 32) -> np.ndarray:
    return np.full((size, size, 3), i % 251, dtype=np.uint8)


def _child_put_and_get(store: LocalStore, q) -> None:
    store.put_many({"from-child": _img(9)})
    got = store.get_many(["from-parent"])
    q.put(int(got["from-parent"][0, 0, 0]) if "from-parent" in got else -1)


def test_put_get_and_miss(shm_dir):
    s = LocalStore(8 << 20, name="t1", directory=shm_dir)
    try:
        assert s.put_many({"a": _img(1), "b": _img(2)}) == 2
        got = s.get_many(["a", "b", "c"])
        assert sorted(got) == ["a", "b"] and np.array_equal(got["b"], _img(2))
        st = s.stats()
        assert (st["hits"], st["misses"], st["items"]) == (2, 1, 2)
    finally:
        s.close()


def test_values_are_never_overwritten(shm_dir):
    s = LocalStore(8 << 20, name="t2", directory=shm_dir)
    try:
        s.put_many({"a": _img(1)})
        s.put_many({"a": _img(5)})
        assert s.get_many(["a"])["a"][0, 0, 0] == 1 and s.stats()["items"] == 1
    finally:
        s.close()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_shared_with_worker_processes(shm_dir, method):
    s = LocalStore(8 << 20, name=f"t3{method}", directory=shm_dir)
    try:
        s.put_many({"from-parent": _img(7)})
        ctx = mp.get_context(method)
        q = ctx.Queue()
        p = ctx.Process(target=_child_put_and_get, args=(s, q))
        p.start()
        assert q.get(timeout=60) == 7
        p.join(60)
        assert p.exitcode == 0
        assert s.get_many(["from-child"])["from-child"][0, 0, 0] == 9
    finally:
        s.close()


def test_pickle_carries_only_configuration(shm_dir):
    s = LocalStore(8 << 20, name="t4", directory=shm_dir)
    s.put_many({"a": _img(1)})
    blob = pickle.dumps(s)
    assert len(blob) < 400 and b"\x00" * 64 not in blob
    other = pickle.loads(blob)
    assert "a" in other.get_many(["a"])  # same process, same file
    s.close()


def test_full_store_stops_puts_and_keeps_serving(shm_dir):
    s = LocalStore(1 << 20, name="t5", directory=shm_dir, max_items=64)
    try:
        stored = sum(s.put_many({f"k{i}": _img(i, 64)}) for i in range(200))
        st = s.stats()
        assert st["full"] == 1 and st["put_rejected"] > 0 and 0 < stored < 200
        assert len(s.get_many([f"k{i}" for i in range(stored)])) == stored
        assert s.put_many({"late": _img(1, 4)}) == 0  # fill, never evict
    finally:
        s.close()


def test_filesystem_full_stops_puts(shm_dir, monkeypatch):
    s = LocalStore(64 << 20, name="t6", directory=shm_dir)
    try:
        s.put_many({"a": _img(1)})
        monkeypatch.setattr(type(s._seg), "reserve", lambda self, off, n: False)
        big = {f"b{i}": np.zeros((1024, 1024, 3), np.uint8) for i in range(4)}
        assert s.put_many(big) < 4 and s.stats()["full"] == 1
        assert "a" in s.get_many(["a"])
    finally:
        s.close()


def test_corrupted_value_is_a_counted_miss(shm_dir):
    s = LocalStore(8 << 20, name="t7", directory=shm_dir)
    other = None
    try:
        s.put_many({"a": _img(1)})
        base = s._table._data_off
        s._seg.buf[base + 200] ^= 0xFF  # flip a payload byte behind the store's back
        other = LocalStore(8 << 20, name="t7", directory=shm_dir)  # a process that has not read "a" yet
        assert other.get_many(["a"]) == {}
        assert other.stats()["errors"] == 1
    finally:
        if other is not None:
            other.close()
        s.close()


def test_last_close_removes_the_file_and_names_are_separate(shm_dir):
    a = LocalStore(8 << 20, name="t8", directory=shm_dir)
    b = LocalStore(8 << 20, name="t8", directory=shm_dir)
    c = LocalStore(8 << 20, name="t8other", directory=shm_dir)
    a.put_many({"x": _img(1)})
    assert "x" in b.get_many(["x"]) and c.get_many(["x"]) == {}
    path = a.path
    a.close()
    assert os.path.exists(path)  # b (another handle) is still attached
    b.close()
    c.close()
    assert not [n for n in os.listdir(shm_dir) if n.startswith(_FILE_PREFIX)]


def test_store_of_a_killed_job_is_reclaimed(shm_dir):
    code = (
        "import sys, numpy as np, memcache, time;"
        f"s = memcache.LocalStore(8 << 20, name='t9', directory={str(shm_dir)!r});"
        "s.put_many({'a': np.zeros(10)}); print('ready', flush=True); time.sleep(60)"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        assert reclaim_stale_stores(shm_dir) == []  # its owner is alive
        os.kill(p.pid, signal.SIGKILL)
        p.wait(30)
        assert reclaim_stale_stores(shm_dir) == [os.path.join(shm_dir, _FILE_PREFIX + "t9")]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(30)


def test_bad_name_and_capacity_are_rejected(shm_dir):
    with pytest.raises(ValueError, match="name"):
        LocalStore(8 << 20, name="a-b/c", directory=shm_dir)
    with pytest.raises(ValueError, match="capacity_bytes"):
        LocalStore(1000, directory=shm_dir)


def test_zero_copy_views_are_read_only(shm_dir):
    s = LocalStore(8 << 20, name="t10", directory=shm_dir)
    try:
        s.put_many({"a": _img(3)})
        view = s.get_many(["a"], copy=False)["a"]
        assert view[0, 0, 0] == 3 and not view.flags.writeable
        with pytest.raises(ValueError):
            view[0, 0, 0] = 1
        del view
    finally:
        s.close()


def _writer(store: LocalStore, start: int) -> None:
    for i in range(start, start + 120, 4):
        store.put_many({f"k{j}": _img(j, 8) for j in range(i, i + 4)})


def test_concurrent_writers_lose_nothing(shm_dir):
    s = LocalStore(8 << 20, name="t11", directory=shm_dir)
    try:
        ctx = mp.get_context("fork")
        procs = [ctx.Process(target=_writer, args=(s, start)) for start in (0, 60, 120)]  # overlapping
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        got = s.get_many([f"k{j}" for j in range(240)])
        assert len(got) == 240 and s.stats()["items"] == 240
        assert all(int(got[f"k{j}"][0, 0, 0]) == j % 251 for j in range(240))
    finally:
        s.close()

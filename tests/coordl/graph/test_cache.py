"""The degree-ordered feature cache: which nodes it holds, hit accounting, sharing, no leaks."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from coordl.graph.cache import FeatureCache
from coordl.graph.loader import NeighborLoader

ROOT = Path(__file__).resolve().parents[3]


def _segments(directory) -> set[str]:
    return {n for n in os.listdir(directory) if n.startswith("coordl-gfeat-")}


def test_cache_holds_the_highest_out_degree_nodes(rmat, tmp_path):
    row = rmat.feature_row_bytes
    cache = FeatureCache(rmat, 100 * row + row // 2, tmp_path)
    try:
        assert cache.slots == 100
        cached = np.flatnonzero(cache.slot_of(np.arange(rmat.num_nodes)) >= 0)
        threshold = np.sort(rmat.out_degree)[::-1][99]
        assert len(cached) == 100 and rmat.out_degree[cached].min() >= threshold
    finally:
        cache.close()


def test_hits_and_misses_are_counted(rmat, tmp_path):
    cache = FeatureCache(rmat, 50 * rmat.feature_row_bytes, tmp_path)
    try:
        hot = np.flatnonzero(cache.slot_of(np.arange(rmat.num_nodes)) >= 0)
        cold = np.setdiff1d(np.arange(rmat.num_nodes), hot)[:30]
        ids = np.concatenate([hot[:20], cold])
        rows, hits, misses = cache.gather(ids)  # first touch: all from the file, hot ones kept
        assert (hits, misses) == (0, 50) and cache.filled == 20
        np.testing.assert_array_equal(rows, rmat.features[ids])
        rows, hits, misses = cache.gather(ids[::-1])
        assert (hits, misses) == (20, 30) and cache.filled == 20  # never evicted, never grows past hot
        np.testing.assert_array_equal(rows, rmat.features[ids[::-1]])
        cache.fill()
        assert cache.filled == 50
    finally:
        cache.close()


def test_a_row_seen_half_written_is_read_from_the_file(rmat, tmp_path):
    # Its check word is written after the row, but another core may see the stores in the other order
    # (ARM): a reader must not serve the row's old bytes (zeros) or half of the new ones.
    cache = FeatureCache(rmat, 10 * rmat.feature_row_bytes, tmp_path)
    try:
        hot = np.flatnonzero(cache.slot_of(np.arange(rmat.num_nodes)) >= 0)
        cache.fill()
        reader = pickle.loads(pickle.dumps(cache))  # a worker's view: it has checked no row yet
        slot = int(cache.slot_of(hot[:1])[0])
        flat = cache._rows[slot].reshape(-1).view(np.uint8)
        assert flat.any()
        kept = flat.copy()
        flat[len(flat) // 2 :] = 0  # what the reader sees: the check word, half of the row
        rows, hits, misses = reader.gather(hot[:3])
        np.testing.assert_array_equal(rows, rmat.features[hot[:3]])
        assert (hits, misses) == (2, 1)
        flat[:] = kept  # the rest of the row arrives: a hit again, then checked no more
        assert reader.gather(hot[:3])[1:] == (3, 0)
        assert reader._verified[cache.slot_of(hot[:3])].all()
        reader.close()
    finally:
        cache.close()


def test_loader_stats_sum_over_workers(rmat, tmp_path):
    budget = 300 * rmat.feature_row_bytes
    with NeighborLoader(
        rmat,
        rmat.train_idx,
        [4, 4],
        batch_size=128,
        num_workers=2,
        pipeline_depth=2,
        feature_cache_bytes=budget,
        seed=0,
        cache_dir=tmp_path,
    ) as loader:
        rows = sum(len(b.input_nodes) for b in loader)
        s1 = loader.stats()
        assert s1["cache_hits"] + s1["cache_misses"] == rows == s1["input_nodes"]
        assert s1["batches"] == len(loader) and s1["cache_filled"] > 0
        list(loader)  # epoch 2: everything hot is filled, so at least as many hits
        s2 = loader.stats()
        hits2 = s2["cache_hits"] - s1["cache_hits"]
        assert hits2 >= s1["cache_hits"] and hits2 > 0
        # After the first epoch the hit ratio equals the share of gathered rows that are hot nodes.
        assert s2["cache_filled"] <= loader.cache.slots == 300


def test_cache_too_large_for_directory_is_a_clean_error(rmat):
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    free = os.statvfs("/dev/shm").f_bavail * os.statvfs("/dev/shm").f_frsize
    big = type(rmat)(
        rmat.indptr,
        rmat.indices,
        rmat.out_degree,
        np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (free // 4096 + 10, 1024), (0, 4)),
        None,
    )
    big.indptr = np.zeros(big.features.shape[0] + 1, dtype=np.int64)
    before = _segments("/dev/shm")
    with pytest.raises(MemoryError, match="feature_cache_bytes"):
        FeatureCache(big, free + (64 << 20))
    assert _segments("/dev/shm") == before


def test_close_removes_the_segment(rmat, tmp_path):
    loader = NeighborLoader(
        rmat,
        rmat.train_idx,
        [2],
        batch_size=256,
        feature_cache_bytes=1 << 16,
        num_workers=2,
        pipeline_depth=2,
        seed=0,
        cache_dir=tmp_path,
    )
    list(loader)
    assert len(_segments(tmp_path)) == 1
    loader.close()
    assert _segments(tmp_path) == set()


SCRIPT = """
import sys, time
sys.path.insert(0, {root!r})
from coordl.graph.graph import Graph
from coordl.graph.loader import NeighborLoader
g = Graph.load({graph!r})
loader = NeighborLoader(g, g.train_idx, [3, 3], batch_size=16, num_workers=2, pipeline_depth=2,
                        feature_cache_bytes=1 << 16, seed=0, cache_dir={shm!r})
it = iter(loader)
next(it)
mode = sys.argv[1]
if mode == "worker":
    msg = "NO ERROR"
    try:  # from the PIDS line on: the kill can come as soon as the test has read it
        print("PIDS", *[w.pid for w in loader._torch._iterator._workers], flush=True)
        for b in it:
            time.sleep(0.05)
    except Exception as e:
        msg = "ERROR %s %s" % (type(e).__name__, str(e)[:300])
    # torch's SIGCHLD handler can raise again (the other worker exiting) between any two bytecodes: one
    # write per line, retried, so a second RuntimeError cannot cut the report in half
    for _ in range(5):
        try:
            sys.stdout.write(msg + "\\n")
            sys.stdout.flush()
            break
        except RuntimeError:
            pass
    loader.close()
    print("CLOSED", flush=True)
else:
    print("PIDS", *[w.pid for w in loader._torch._iterator._workers], flush=True)
    time.sleep(60)
"""


def _start(tmp_path, rmat_dir, mode):
    code = SCRIPT.format(root=str(ROOT), graph=str(rmat_dir), shm=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", code, mode], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("PIDS"), line
    return proc, [int(p) for p in line.split()[1:]]


def test_kill9_of_a_worker_raises_and_leaves_no_segment(tmp_path, rmat_dir):
    proc, pids = _start(tmp_path, rmat_dir, "worker")
    assert len(_segments(tmp_path)) == 1
    os.kill(pids[0], signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    # torch's SIGCHLD handler may raise its RuntimeError inside the loop body, before next() can
    # wrap it as WorkerDiedError: either way the death is reported, not hung on.
    assert "ERROR WorkerDiedError" in out or "killed by signal" in out
    assert "CLOSED" in out
    assert _segments(tmp_path) == set()


def test_kill9_of_the_owner_is_reclaimed_at_next_start(tmp_path, rmat_dir, rmat):
    proc, pids = _start(tmp_path, rmat_dir, "owner")
    assert len(_segments(tmp_path)) == 1
    proc.kill()
    proc.wait(timeout=30)
    for pid in pids:  # its workers exit when their parent is gone
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
    FeatureCache(rmat, 1 << 12, tmp_path).close()  # any new segment reclaims the dead owner's
    assert _segments(tmp_path) == set()

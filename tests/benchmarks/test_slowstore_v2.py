"""benchmarks/slowstore.py on cgroup v2 (the GPU machines mount no v1 hierarchies), against fake cgroup files.

This machine has cgroup v1, so the kernel side of v2 (io.max throttling a loop device, memory.reclaim
freeing file pages) is exercised only where v2 is mounted; here a folder with v2's file names checks what
SlowStore writes and how it reads v2's formats: the throttle line, the read counter, the reclaim of the
file pages over the bound, and the cgroup it joins.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_loader  # noqa: E402
import slowstore  # noqa: E402


@pytest.fixture
def v2(tmp_path, monkeypatch):
    monkeypatch.setattr(slowstore, "CG", str(tmp_path))
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    store = slowstore.SlowStore.__new__(slowstore.SlowStore)  # no loop device, no mount: the cgroup side only
    store.v2, store.name, store.device, store.page_cache_bytes = True, "t-slowstore", "7:3", 10 << 20
    cg = tmp_path / store.name
    cg.mkdir()
    return store, cg


def test_v2_is_enough_and_names_a_missing_controller(tmp_path, monkeypatch):
    monkeypatch.setattr(slowstore, "CG", str(tmp_path))
    (tmp_path / "cgroup.controllers").write_text("cpu io memory\n")
    assert slowstore.cgroup_missing() == ""
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    assert "io" in slowstore.cgroup_missing()
    (tmp_path / "cgroup.controllers").unlink()
    assert "cgroup v1" in slowstore.cgroup_missing()


def test_v2_throttle_counter_and_procs(v2):
    store, cg = v2
    store.set_read_bps(8_000_000)
    assert (cg / "io.max").read_text() == "7:3 rbps=8000000"
    store.set_read_bps(None)
    assert (cg / "io.max").read_text() == "7:3 rbps=max"
    (cg / "io.stat").write_text(
        "7:3 rbytes=4096000 wbytes=0 rios=100 wios=0 dbytes=0 dios=0\n8:0 rbytes=99 wbytes=1\n"
    )
    assert store.read_bytes() == 4096000
    assert bench_loader._blkio_read(store.io_counter, "7:3") == 4096000  # the children read the same file
    assert store.cgroup_procs_paths() == [str(cg / "cgroup.procs")]


def test_v2_reclaims_only_the_file_pages_over_the_bound(v2):
    store, cg = v2
    stat = "anon 500000000\nactive_file {a}\ninactive_file {i}\nshmem 7\n"
    (cg / "memory.stat").write_text(stat.format(a=6 << 20, i=2 << 20))  # 8 MB of file pages: under 10 MB
    store._reclaim_excess(str(cg))
    assert not (cg / "memory.reclaim").exists()
    (cg / "memory.stat").write_text(stat.format(a=9 << 20, i=4 << 20))  # 13 MB: 3 MB over
    store._reclaim_excess(str(cg))
    assert int((cg / "memory.reclaim").read_text()) == 3 << 20
    store._reclaim_excess(str(cg), bound=0)  # evict(): every file page
    assert int((cg / "memory.reclaim").read_text()) == 13 << 20

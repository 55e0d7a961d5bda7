"""The scale curve's "other paths" (``benchmarks/scale_paths.py``) run at 1,000 items and answer sanely.

Not a timing test: each section must run end to end (its servers, processes and segments gone after it),
return the keys ``bench_scale.py`` prints, and give figures that follow from what was built (item counts,
byte bounds of each format, nothing staged twice after an interrupt). Timings only need to be positive.
"""

from __future__ import annotations

import glob
import math
import os
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import scale_paths  # noqa: E402

N = 1000


def _check_numbers(metrics: dict) -> None:
    assert metrics["items"] == N
    for key, value in metrics.items():
        assert isinstance(value, (int, float, str)), key
        if isinstance(value, float):
            assert math.isfinite(value) and value >= 0, (key, value)
        if key.endswith("_s") or key.endswith("_per_s"):
            assert value > 0, (key, value)


def _run(name: str, tmp_path: Path) -> dict:
    fn, max_n = scale_paths.SECTIONS[name]
    assert max_n >= 10**5
    metrics = fn(N, tmp_path)
    _check_numbers(metrics)
    return metrics


def test_sections_are_named_with_their_caps() -> None:
    assert set(scale_paths.SECTIONS) == {
        "minio_index", "partitioned_state", "coordinated_state", "packed", "nfs_staging", "dsanalyzer_profile"
    }  # fmt: skip


def _own_segments() -> list[str]:
    """Shared-memory files this process owns (their names carry the owner's pid; others' come and go)."""
    return glob.glob(f"/dev/shm/*-{os.getpid()}-*")


def test_minio_index(tmp_path: Path) -> None:
    m = _run("minio_index", tmp_path)
    assert m["stored_items"] == m["cached_items"] == N
    assert 40 <= m["index_bytes_per_item"] < 41  # 40-byte rows and one 512-byte header
    assert m["segment_bytes"] >= m["index_bytes"] + 16 * N
    assert not _own_segments()  # the segment is gone


@pytest.mark.redis
def test_partitioned_state(tmp_path: Path) -> None:
    m = _run("partitioned_state", tmp_path)
    for nodes in (2, 8):
        assert m[f"owned_{nodes}_items"] in (N // nodes, N // nodes + 1)
        assert m[f"sampler_{nodes}_shard_items"] == -(-N // nodes)
        assert 4 <= m[f"owner_map_{nodes}_bytes_per_item"] < 64  # an int32 per item, not objects
    assert m["redis_storage_reads"] == N  # one epoch, cold: every item read once
    assert m["redis_keys"] == N  # and each pushed to its owner
    assert 16 < m["redis_bytes_per_key"] < 1000
    assert not _own_segments()  # both nodes' caches and counters


def test_coordinated_state(tmp_path: Path) -> None:
    m = _run("coordinated_state", tmp_path)
    assert m["items_seen"] == N and m["batches_per_epoch"] == 4
    assert m["ctl_bytes"] < 16 << 10  # a fixed layout: no per-item state
    assert not list(tmp_path.glob("coordl-grp-*"))  # the last member removed the group's files


def test_packed(tmp_path: Path) -> None:
    m = _run("packed", tmp_path)
    assert m["lmdb_disk_bytes_per_item"] < 1024  # records of 40 bytes in 4 KiB pages
    assert 1024 <= m["tar_disk_bytes_per_item"] < 4096  # two members of 512-byte header + 512-byte block
    assert m["lmdb_index_bytes_per_item"] < 64  # the labels as int64, not objects


def test_nfs_staging(tmp_path: Path) -> None:
    m = _run("nfs_staging", tmp_path)
    assert 0 < m["staged_before_kill"] <= N + 1
    # Nothing recorded before the kill is copied again; the one copy the kill may catch between its rename
    # and its manifest record is not recorded, so it is copied once more.
    assert m["resume_recopied_files"] in (0, 1)
    assert m["resume_already_files"] + m["resume_copied_files"] == N + 1  # the tree's marker file too
    assert 20 < m["manifest_bytes_per_item"] < 200


@pytest.mark.slow
def test_dsanalyzer_profile(tmp_path: Path) -> None:
    m = _run("dsanalyzer_profile", tmp_path)
    assert m["listed_items"] == m["report_dataset_items"] == N
    assert 1000 < m["report_json_bytes"] < 10 << 20
    assert m["bound"]
    assert not [p for p in os.listdir(tmp_path / "profile" / "logs") if p.endswith(".pid")]

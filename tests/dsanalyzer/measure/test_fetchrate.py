"""The cold read probe (:func:`dsanalyzer.measure.fetchrate.measure_fetch_rate`): rates and what a read costs in CPU."""

from __future__ import annotations

import time

from dsanalyzer.measure.fetchrate import measure_fetch_rate


def test_the_probe_reports_a_cold_and_a_cached_reads_cpu(tmp_path):
    files = []
    for i in range(40):
        path = tmp_path / f"{i:03d}.bin"
        path.write_bytes(bytes([i]) * 90_000)
        files.append(str(path))
    got = measure_fetch_rate(files=files, threads=2, max_items=32)
    assert got["items"] == 32 and got["bytes"] == 32 * 90_000
    assert got["cold_read_cpu_s"] > 0 and got["warm_read_cpu_s"] > 0
    assert got["warm_read_cpu_s"] < 0.01  # a 90 KB read from the page cache: tens of microseconds


class SlowSource:
    """An item source whose reads cost CPU: the second pass is timed like the first."""

    def __len__(self) -> int:
        return 20

    def fetch(self, i: int) -> bytes:
        end = time.thread_time() + 0.002
        while time.thread_time() < end:
            pass
        return b"x" * 100


def test_the_cached_pass_reads_the_same_items_through_the_same_path():
    got = measure_fetch_rate(source=SlowSource(), threads=1, max_items=10)
    assert got["items"] == 10
    assert 0.0015 < got["warm_read_cpu_s"] < 0.01 and 0.0015 < got["cold_read_cpu_s"] < 0.01


def test_files_just_written_are_evicted_too(tmp_path):
    """Dirty pages cannot be dropped: evict_files flushes them (one sync for all files, not one per file)."""
    import os

    from dsanalyzer.measure.fetchrate import evict_files, resident_fraction

    paths = []
    for i in range(20):
        p = tmp_path / f"{i}.bin"
        p.write_bytes(os.urandom(64 << 10))
        paths.append(str(p))
    assert resident_fraction(paths) > 0.9
    assert evict_files(paths) == 20
    assert resident_fraction(paths) < 0.1

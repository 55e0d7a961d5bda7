"""page_cache= (coordl/fetch/pagecache.py): storage reads past the OS page cache when the dataset's bytes
outside the MinIO cache exceed the memory left for the page cache; batches unchanged either way."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import coordl
from coordl.fetch import pagecache
from coordl.fetch.pagecache import RECHECK_READS, PageCachePolicy, page_cache_room
from coordl.prep.transforms import CenterCrop, Compose, Decode, ToTensor
from tests.coordl.pagecache_files import direct_dir, drop, resident_pages

# -- the room: /proc/meminfo and the memory cgroups, from fake trees ---------------------------------


def _tree(tmp_path, cgroup_line: str, files: dict[str, str], available_kb: int = 8 << 20) -> tuple[str, str]:
    proc, root = tmp_path / "proc", tmp_path / "cg"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal: 99 kB\nMemAvailable: {available_kb} kB\n")
    (proc / "self" / "cgroup").write_text(cgroup_line + "\n")
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return str(proc), str(root)


def test_room_without_a_limited_cgroup_is_mem_available(tmp_path) -> None:
    proc, root = _tree(tmp_path, "0::/", {"memory.max": "max"}, available_kb=1000)
    assert page_cache_room(proc, root) == 1000 * 1024


def test_room_in_a_v1_cgroup_is_its_headroom_plus_its_file_pages(tmp_path) -> None:
    stat = "cache 900\nshmem 800\nactive_file 30\ninactive_file 20\n"
    proc, root = _tree(tmp_path, "4:memory:/jobs/a", {
        "memory/jobs/a/memory.limit_in_bytes": "1000", "memory/jobs/a/memory.usage_in_bytes": "900",
        "memory/jobs/a/memory.stat": stat,
        "memory/jobs/memory.limit_in_bytes": "9223372036854771712",  # unlimited: no bound
        "memory/memory.limit_in_bytes": "9223372036854771712",
    })  # fmt: skip
    assert page_cache_room(proc, root) == 100 + 50  # shared memory (shmem) is not room


def test_room_in_v2_is_the_tightest_level(tmp_path) -> None:
    proc, root = _tree(tmp_path, "0::/a/b", {
        "a/b/memory.max": "max",
        "a/memory.max": "5000", "a/memory.current": "4000", "a/memory.stat": "active_file 100\ninactive_file 0\n",
        "memory.max": "max",
    })  # fmt: skip
    assert page_cache_room(proc, root) == 1100


def test_unreadable_files_mean_no_bound(tmp_path) -> None:
    proc, root = str(tmp_path / "none"), str(tmp_path / "none")
    assert page_cache_room(proc, root) >= 1 << 60


# -- the decision ------------------------------------------------------------------------------------


class FakeMinio:
    def __init__(self, capacity: int, items: int, value_bytes: int) -> None:
        self.capacity_bytes, self.items, self.value_bytes = capacity, items, value_bytes

    def stats(self) -> dict:
        return {"cached_items": self.items, "cached_bytes": self.value_bytes}


def test_auto_bypasses_only_when_the_rest_exceeds_the_room() -> None:
    minio = FakeMinio(
        capacity=500_000, items=100, value_bytes=500_000
    )  # 5 KB items, 1000 of them: 4.5 MB outside
    assert PageCachePolicy("auto", minio, 1000, room=lambda: 4_000_000).bypass() is True
    p = PageCachePolicy("auto", minio, 1000, room=lambda: 5_000_000)
    assert p.bypass() is False and p.outside_bytes == 4_500_000 and p.room_bytes == 5_000_000


def test_auto_uses_the_page_cache_until_it_can_estimate() -> None:
    minio = FakeMinio(capacity=1000, items=0, value_bytes=0)
    p = PageCachePolicy("auto", minio, 10_000, room=lambda: 0)
    assert [p.bypass() for _ in range(16)] == [False] * 16
    minio.items, minio.value_bytes = 10, 1000  # the cache has filled: 100 B items, ~1 MB outside
    assert p.bypass() is True


def test_auto_looks_again_as_memory_changes() -> None:
    room = [10 << 30]
    minio = FakeMinio(capacity=1 << 20, items=1000, value_bytes=1 << 20)
    p = PageCachePolicy("auto", minio, 100_000, room=lambda: room[0])
    assert p.bypass() is False
    room[0] = 1 << 20  # the machine's memory filled up
    seen = [p.bypass() for _ in range(RECHECK_READS)]
    assert seen[-1] is True and seen[0] is False  # within one look's interval


def test_fixed_modes_and_no_cache() -> None:
    minio = FakeMinio(capacity=1, items=1, value_bytes=10)
    assert PageCachePolicy("use", minio, 10**6, room=lambda: 0).bypass() is False
    assert PageCachePolicy("bypass", None, 10, room=lambda: 1 << 40).bypass() is True
    assert (
        PageCachePolicy("auto", None, 10**6, room=lambda: 0).bypass() is False
    )  # no MinIO: the page cache is the cache
    with pytest.raises(ValueError, match="page_cache"):
        PageCachePolicy("never", minio, 1)


def test_loader_refuses_a_bad_mode_naming_the_option(tmp_path) -> None:
    with pytest.raises(ValueError, match="page_cache must be one of 'auto', 'use', 'bypass'"):
        coordl.DataLoader(list(range(4)), page_cache="off")


# -- through the loader, against torch's DataLoader ---------------------------------------------------


@pytest.fixture(scope="module")
def disk_root(tmp_path_factory) -> Iterator[str]:
    from coordl.datasets.synth import make_dataset

    with direct_dir(tmp_path_factory) as d:
        root = os.path.join(d, "folder")
        make_dataset(root, 48, classes=3, width=96, height=72, seed=1, workers=1)
        yield root


def _files(root: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".jpg"))


def _batches(loader) -> list[tuple[np.ndarray, list[int]]]:
    return [(x.numpy().copy(), y.tolist()) for x, y in loader]


@pytest.mark.parametrize("mode", ["bypass", "use"])
def test_batches_equal_torch_and_bypass_leaves_misses_out_of_the_page_cache(disk_root, mode: str) -> None:
    tf = Compose([Decode(), CenterCrop(64), ToTensor()])
    ds = coordl.ImageFolder(disk_root, tf)
    half = sum(os.path.getsize(p) for p in _files(disk_root)) // 2
    plain = torch.utils.data.DataLoader(
        ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(3)
    )
    wants = [_batches(plain) for _ in range(2)]  # two epochs
    for p in _files(disk_root):
        drop(p)
    if any(resident_pages(p) for p in _files(disk_root)):
        pytest.skip("the kernel kept pages after POSIX_FADV_DONTNEED")
    with coordl.DataLoader(
        ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(3), num_workers=2,
        cache_bytes=half, page_cache=mode,
    ) as dl:  # fmt: skip
        for want in wants:
            got = _batches(dl)
            assert [y for _, y in got] == [y for _, y in want]
            assert all(np.array_equal(a, b) for (a, _), (b, _) in zip(got, want, strict=True))
        stats = dl.stats()
    assert 0 < stats["cached_items"] < len(ds) and stats["storage_items_read"] > len(ds)  # misses re-read
    resident = sum(1 for p in _files(disk_root) if resident_pages(p))
    assert (resident == 0) if mode == "bypass" else (resident == len(ds))


def test_auto_keeps_the_page_cache_when_memory_has_room(disk_root) -> None:
    ds = coordl.ImageFolder(disk_root, Compose([Decode(), CenterCrop(64), ToTensor()]))
    for p in _files(disk_root):
        drop(p)
    assert page_cache_room() > 10 * sum(
        os.path.getsize(p) for p in _files(disk_root)
    )  # a few hundred KB here
    with coordl.DataLoader(ds, batch_size=8, num_workers=2, cache_bytes=20_000) as dl:
        assert dl.page_cache == "auto"
        for _ in dl:
            pass
    assert all(resident_pages(p) for p in _files(disk_root))


def test_auto_reads_past_the_page_cache_when_memory_is_short(disk_root, monkeypatch) -> None:
    monkeypatch.setattr(pagecache, "page_cache_room", lambda: 0)  # as if the memory cgroup were full
    ds = coordl.ImageFolder(disk_root, Compose([Decode(), CenterCrop(64), ToTensor()]))
    for p in _files(disk_root):
        drop(p)
    with coordl.DataLoader(ds, batch_size=8, num_workers=0, cache_bytes=20_000) as dl:
        for _ in range(2):
            for _ in dl:
                pass
    resident = sum(1 for p in _files(disk_root) if resident_pages(p))
    assert resident <= 1  # the first read: nothing cached yet to estimate the item size from

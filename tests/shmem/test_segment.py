"""``Segment.reserve`` refuses a range it cannot back before taking any page (no OOM kill on a RAM-sized tmpfs)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from shmem import segment as segment_mod
from shmem.segment import Segment, free_bytes


def test_reserve_within_free_space_backs_the_pages(tmp_path):
    seg = Segment.create("t", 1 << 20, tmp_path)
    try:
        assert seg.reserve(0, 1 << 20)
        assert os.stat(seg.path).st_blocks * 512 >= 1 << 20
    finally:
        seg.close()


def test_reserve_beyond_free_space_is_refused_without_allocating(tmp_path):
    length = free_bytes(tmp_path) + (1 << 30)
    seg = Segment.create("t", length, tmp_path)
    try:
        assert not seg.reserve(0, length)
        assert os.stat(seg.path).st_blocks == 0
    finally:
        seg.close()


def test_reserve_on_tmpfs_beyond_available_memory_is_refused(monkeypatch):
    """/dev/shm may be as large as RAM: its free space is no promise of memory, so reserve checks both."""
    if not os.path.isdir("/dev/shm") or not segment_mod._is_tmpfs("/dev/shm"):
        pytest.skip("no tmpfs /dev/shm")
    monkeypatch.setattr(segment_mod.psutil, "virtual_memory", lambda: SimpleNamespace(available=32 << 20))
    seg = Segment.create("t", 64 << 20, "/dev/shm")
    try:
        assert not seg.reserve(0, 64 << 20)
        assert os.stat(seg.path).st_blocks == 0
        assert seg.reserve(0, 16 << 20)  # what fits is still backed
    finally:
        seg.close()


def test_attaching_to_a_segment_its_owner_closed_names_it(tmp_path) -> None:
    import pickle

    seg = Segment.create("gone", 4096, tmp_path)
    state = pickle.dumps(seg)  # what a spawned worker receives
    seg.close()
    with pytest.raises(
        FileNotFoundError, match=r"segment .*coordl-gone-.* is gone: the process that made it"
    ):
        pickle.loads(state)

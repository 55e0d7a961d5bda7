"""read_file (coordl/data/fileread.py): the same bytes either way; with cached=False nothing is left in
the page cache where the file system has O_DIRECT, and the ordinary read where it has not."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import threading
from pathlib import Path

import pytest

from coordl.data import fileread
from coordl.data.fileread import read_file

SIZES = [0, 1, 4095, 4096, 4097, 100_000, 3 << 20]


def _write(path, n: int, seed: int = 0) -> bytes:
    data = bytes((i * 131 + seed) % 251 for i in range(min(n, 4096))) * (n // 4096 + 1)
    data = data[:n]
    path.write_bytes(data)
    return data


def _direct_dir(tmp_path_factory) -> str:
    """A directory on a file system with O_DIRECT (the test's tmp dir, else /var/tmp), or skip."""
    for base in (str(tmp_path_factory.getbasetemp()), "/var/tmp"):
        d = os.path.join(base, f"direct-{os.getpid()}")
        os.makedirs(d, exist_ok=True)
        probe = os.path.join(d, "probe")
        with open(probe, "wb") as f:
            f.write(b"x" * 4096)
        try:
            os.close(os.open(probe, os.O_RDONLY | os.O_DIRECT))
            return d
        except OSError:
            continue
    pytest.skip("no file system with O_DIRECT here")


def _resident_pages(path: str) -> int:
    """How many of the file's pages are in the page cache (mincore over a mapping of it)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = os.path.getsize(path)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            pytest.skip("mmap failed")
        try:
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                pytest.skip(f"mincore failed: {os.strerror(ctypes.get_errno())}")
            return sum(v & 1 for v in vec)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def _drop(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.mark.parametrize("cached", [True, False])
@pytest.mark.parametrize("size", SIZES)
def test_same_bytes_at_every_size(tmp_path, size: int, cached: bool) -> None:
    want = _write(tmp_path / "f", size)
    assert read_file(tmp_path / "f", cached=cached) == want


def test_uncached_read_leaves_no_pages_and_cached_read_does(tmp_path_factory) -> None:
    d = _direct_dir(tmp_path_factory)
    path = os.path.join(d, "item.jpg")
    want = _write(Path(path), 300_000, seed=3)
    _drop(path)
    if _resident_pages(path) != 0:
        pytest.skip("the kernel kept the pages after POSIX_FADV_DONTNEED")
    assert read_file(path, cached=False) == want
    assert _resident_pages(path) == 0
    assert read_file(path, cached=True) == want
    assert _resident_pages(path) > 0  # the control: an ordinary read does leave them


def test_file_system_without_o_direct_reads_the_ordinary_way(tmp_path) -> None:
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    path = os.path.join("/dev/shm", f"coordl-fileread-{os.getpid()}")
    try:
        with open(path, "wb") as f:
            f.write(b"tmpfs has no O_DIRECT" * 1000)
        assert read_file(path, cached=False) == b"tmpfs has no O_DIRECT" * 1000
    finally:
        os.unlink(path)


def test_a_file_longer_than_fstat_said_is_read_to_its_end(tmp_path_factory) -> None:
    d = _direct_dir(tmp_path_factory)
    want = _write(Path(d) / "grown", (2 << 20) + 123, seed=5)
    fd = os.open(os.path.join(d, "grown"), os.O_RDONLY | os.O_DIRECT)
    try:
        assert fileread._read_direct(fd, 10) == want  # as if it grew from 10 bytes after fstat
    finally:
        os.close(fd)


def test_missing_file_raises_naming_it(tmp_path) -> None:
    with pytest.raises(FileNotFoundError) as e:
        read_file(tmp_path / "nope.jpg", cached=False)
    assert "nope.jpg" in str(e.value)


def test_a_refused_direct_read_falls_back_and_is_remembered(tmp_path_factory, monkeypatch) -> None:
    d = _direct_dir(tmp_path_factory)
    want = _write(Path(d) / "a", 50_000)

    def refuse(fd, size):
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(fileread, "_read_direct", refuse)
    monkeypatch.setattr(fileread, "_no_direct", set())
    assert read_file(os.path.join(d, "a"), cached=False) == want
    assert os.stat(os.path.join(d, "a")).st_dev in fileread._no_direct


def test_threads_read_with_their_own_buffers(tmp_path) -> None:
    files = {i: _write(tmp_path / f"{i}", 5000 + 70_000 * (i % 5), seed=i) for i in range(16)}
    errors: list[str] = []

    def run(k: int) -> None:
        for r in range(40):
            i = (k * 7 + r) % 16
            if read_file(tmp_path / f"{i}", cached=False) != files[i]:
                errors.append(f"thread {k}: file {i}")

    threads = [threading.Thread(target=run, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []

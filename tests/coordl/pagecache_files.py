"""Files on a file system with O_DIRECT, and what the page cache holds of them (for the page_cache= tests)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest


def write_pattern(path, n: int, seed: int = 0) -> bytes:
    """Write ``n`` bytes of a seeded pattern to ``path`` (a pathlib.Path) and return them."""
    data = (bytes((i * 131 + seed) % 251 for i in range(4096)) * (n // 4096 + 1))[:n]
    path.write_bytes(data)
    return data


@contextlib.contextmanager
def direct_dir(tmp_path_factory) -> Iterator[str]:
    """A fresh directory on a file system with O_DIRECT (under the tests' tmp dir, else /var/tmp, removed
    afterwards), or skip."""
    for base in (str(tmp_path_factory.getbasetemp()), "/var/tmp"):
        d = tempfile.mkdtemp(prefix="coordl-direct-", dir=base)
        probe = os.path.join(d, "probe")
        with open(probe, "wb") as f:
            f.write(b"x" * 4096)
        try:
            os.close(os.open(probe, os.O_RDONLY | os.O_DIRECT))
        except OSError:
            shutil.rmtree(d, ignore_errors=True)
            continue
        try:
            yield d
        finally:
            shutil.rmtree(d, ignore_errors=True)
        return
    pytest.skip("no file system with O_DIRECT here")


def resident_pages(path: str) -> int:
    """How many of the file's pages are in the page cache (mincore over a mapping of it)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
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


def drop(path: str) -> None:
    """Write back and evict the file's pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)

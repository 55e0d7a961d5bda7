"""read_file (coordl/fileread/read.py): the same bytes either way; with cached=False nothing is left in
the page cache where the file system has O_DIRECT, and the ordinary read where it has not."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordl.fileread import read
from coordl.fileread.read import read_file
from tests.coordl.pagecache_files import direct_dir, drop, resident_pages
from tests.coordl.pagecache_files import write_pattern as _write

SIZES = [0, 1, 4095, 4096, 4097, 100_000, 3 << 20]


@pytest.fixture(scope="module")
def direct(tmp_path_factory) -> Iterator[str]:
    with direct_dir(tmp_path_factory) as d:
        yield d


@pytest.mark.parametrize("cached", [True, False])
@pytest.mark.parametrize("size", SIZES)
def test_same_bytes_at_every_size(tmp_path, size: int, cached: bool) -> None:
    want = _write(tmp_path / "f", size)
    assert read_file(tmp_path / "f", cached=cached) == want


def test_uncached_read_leaves_no_pages_and_cached_read_does(direct: str) -> None:
    d = direct
    path = os.path.join(d, "item.jpg")
    want = _write(Path(path), 300_000, seed=3)
    drop(path)
    if resident_pages(path) != 0:
        pytest.skip("the kernel kept the pages after POSIX_FADV_DONTNEED")
    assert read_file(path, cached=False) == want
    assert resident_pages(path) == 0
    assert read_file(path, cached=True) == want
    assert resident_pages(path) > 0  # the control: an ordinary read does leave them


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


def test_a_file_longer_than_fstat_said_is_read_to_its_end(direct: str) -> None:
    d = direct
    want = _write(Path(d) / "grown", (2 << 20) + 123, seed=5)
    fd = os.open(os.path.join(d, "grown"), os.O_RDONLY | os.O_DIRECT)
    try:
        assert read._read_direct(fd, 10) == want  # as if it grew from 10 bytes after fstat
    finally:
        os.close(fd)


def test_missing_file_raises_naming_it(tmp_path) -> None:
    with pytest.raises(FileNotFoundError) as e:
        read_file(tmp_path / "nope.jpg", cached=False)
    assert "nope.jpg" in str(e.value)


def test_a_refused_direct_read_falls_back_and_is_remembered(direct: str, monkeypatch) -> None:
    d = direct
    want = _write(Path(d) / "a", 50_000)

    def refuse(fd, size):
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(read, "_read_direct", refuse)
    monkeypatch.setattr(read, "_no_direct", set())
    assert read_file(os.path.join(d, "a"), cached=False) == want
    assert os.stat(os.path.join(d, "a")).st_dev in read._no_direct


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


def _read_own_file(path: str, want: bytes, reads: int, bad) -> None:
    for _ in range(reads):
        if read_file(path, cached=False) != want:
            with bad.get_lock():
                bad.value += 1


def test_forked_workers_never_read_into_the_buffer_of_the_process_that_forked_them(direct: str) -> None:
    """The bug a CI run found: the read buffer was a *shared* anonymous mapping, so loader workers forked
    from a thread that had read with cached=False wrote their files into the same pages, and each got
    bytes of the other's file (wrong pixels, no error). Now the buffer is private and a forked child
    makes its own."""
    import multiprocessing as mp

    files = {k: _write(Path(direct) / f"w{k}", 300_000, seed=k) for k in range(2)}
    assert read_file(Path(direct) / "w0", cached=False) == files[0]  # this thread now has a buffer
    inherited = read._local.buffer
    inherited[:4] = b"PPPP"
    ctx = mp.get_context("fork")
    bad = ctx.Value("i", 0)

    def child() -> None:
        fresh = getattr(read._local, "buffer", None) is None
        inherited[:4] = b"CCCC"  # a write through the inherited mapping stays in this process
        os._exit(0 if fresh else 3)

    p = ctx.Process(target=child)
    p.start()
    p.join(30)
    assert p.exitcode == 0 and inherited[:4] == b"PPPP"
    readers = [
        ctx.Process(target=_read_own_file, args=(str(Path(direct) / f"w{k}"), files[k], 300, bad))
        for k in (0, 1)
    ]
    for r in readers:
        r.start()
    for r in readers:
        r.join(120)
    assert [r.exitcode for r in readers] == [0, 0] and bad.value == 0

"""ReadAhead (coordl/fileread/read.py, native threads in coordl/fileread/readahead.c): read_file's bytes
and errors from background threads, with and without the extension; cancelled reads are not made; one
reader per process; and a loader worker's storage reads of local files go through it."""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Iterator

import pytest
import torch

import coordl
from coordl.datasets.files import FileListDataset, ImageFolder
from coordl.fileread import read
from coordl.fileread.read import ReadAhead, read_file
from tests.coordl.pagecache_files import direct_dir, drop, resident_pages
from tests.coordl.pagecache_files import write_pattern as _write

SIZES = [0, 1, 4095, 4096, 4097, 100_000, 3 << 20]
native_only = pytest.mark.skipif(read._readahead is None, reason="coordl.fileread._readahead is not built")


@pytest.fixture(params=["native", "python"])
def reader(request, monkeypatch) -> ReadAhead:
    if request.param == "native" and read._readahead is None:
        pytest.skip("coordl.fileread._readahead is not built")
    if request.param == "python":
        monkeypatch.setattr(read, "_readahead", None)
    r = ReadAhead(3)
    assert r.native == (request.param == "native")
    return r


@pytest.fixture(scope="module")
def direct(tmp_path_factory) -> Iterator[str]:
    with direct_dir(tmp_path_factory) as d:
        yield d


@pytest.mark.parametrize("cached", [True, False])
def test_the_bytes_of_read_file_at_every_size(reader, tmp_path, cached: bool) -> None:
    files = {n: _write(tmp_path / f"f{n}", n, seed=n) for n in SIZES}
    handles = {n: reader.submit(tmp_path / f"f{n}", cached=cached) for n in SIZES}  # all in flight at once
    for n, handle in handles.items():
        assert handle.result() == files[n] == read_file(tmp_path / f"f{n}", cached=cached)


@native_only
def test_an_uncached_read_leaves_no_page_and_a_cached_one_does(direct) -> None:
    from pathlib import Path

    r = ReadAhead(2)
    for cached in (False, True):
        path = os.path.join(direct, f"resident-{cached}")
        want = _write(Path(path), 1 << 20)
        drop(path)
        assert resident_pages(path) == 0
        assert r.submit(path, cached=cached).result() == want
        assert (resident_pages(path) > 0) == cached


def test_tmpfs_falls_back_to_an_ordinary_read(reader) -> None:
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    path = f"/dev/shm/coordl-readahead-{os.getpid()}"
    try:
        with open(path, "wb") as f:
            f.write(b"tmpfs has no O_DIRECT" * 1000)
        assert reader.submit(path, cached=False).result() == b"tmpfs has no O_DIRECT" * 1000
    finally:
        os.unlink(path)


def test_errors_are_read_files_and_name_the_file(reader, tmp_path) -> None:
    missing = tmp_path / "missing.jpg"
    with pytest.raises(FileNotFoundError) as e:
        reader.submit(missing, cached=False).result()
    assert e.value.filename == str(missing)
    with pytest.raises(IsADirectoryError):
        reader.submit(tmp_path).result()
    want = _write(tmp_path / "ok", 5000)
    assert (
        reader.submit(tmp_path / "ok", cached=False).result() == want
    )  # the reader still works after errors


def _in_thread(fn, timeout: float = 20.0):
    """``fn()`` in a thread (result() waits without the GIL): its result, or a failure after ``timeout``."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"no result in {timeout} s"
    return out[0]


@native_only
@pytest.mark.timeout(60)
def test_a_cancelled_read_is_never_made(tmp_path) -> None:
    # One thread. A blocks it on a FIFO with no writer; B is queued behind it and cancelled; C follows.
    # Had B's read been made, it would block the thread on its own FIFO forever and C would never come.
    r = ReadAhead(1)
    fifo_a, fifo_b = tmp_path / "a", tmp_path / "b"
    os.mkfifo(fifo_a)
    os.mkfifo(fifo_b)
    want = _write(tmp_path / "c", 5000)
    a, b = r.submit(fifo_a), r.submit(fifo_b)
    b.cancel()
    c = r.submit(tmp_path / "c")
    with open(fifo_a, "wb") as w:  # unblocks A's open
        w.write(b"through the fifo")
    assert _in_thread(a.result) == b"through the fifo"
    assert _in_thread(c.result) == want
    with pytest.raises(RuntimeError, match="taken or cancelled"):
        b.result()
    with pytest.raises(RuntimeError, match="taken or cancelled"):
        c.result()  # taken once


@native_only
def test_handles_dropped_unread_free_their_reads(tmp_path) -> None:
    r = ReadAhead(4)
    want = _write(tmp_path / "f", 200_000)
    for _ in range(20):
        handles = [r.submit(tmp_path / "f", cached=False) for _ in range(50)]
        del handles  # neither taken nor cancelled: dropped with the handle
    assert [r.submit(tmp_path / "f").result() for _ in range(5)] == [want] * 5


@native_only
def test_many_threads_submitting_at_once(tmp_path) -> None:
    r = ReadAhead(4)
    files = {i: _write(tmp_path / f"f{i}", 1000 + 997 * i, seed=i) for i in range(40)}
    errors: list[BaseException] = []

    def client(k: int) -> None:
        try:
            for rep in range(5):
                hs = [(i, r.submit(tmp_path / f"f{i}", cached=bool((i + rep) % 2))) for i in range(k, 40, 4)]
                for i, h in hs:
                    assert h.result() == files[i]
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors


def _child(reader: ReadAhead, path: str, q) -> None:
    try:
        reader.submit(path)
        q.put("parent's reader accepted a submit")
    except RuntimeError as e:
        q.put(f"refused: {e}" if reader.native else "python")
    q.put(ReadAhead(2).submit(path).result())


def test_a_forked_child_makes_its_own_reader(reader, tmp_path) -> None:
    want = _write(tmp_path / "f", 10_000)
    assert reader.submit(tmp_path / "f").result() == want  # the parent's threads are running
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(reader, str(tmp_path / "f"), q))
    p.start()
    first, second = q.get(timeout=30), q.get(timeout=30)
    p.join(30)
    if reader.native:
        assert first.startswith("refused") and "another process" in first
    assert second == want and p.exitcode == 0
    assert reader.submit(tmp_path / "f").result() == want  # and the parent's still works


@native_only
def test_bad_arguments_name_what_is_wrong(tmp_path) -> None:
    with pytest.raises(ValueError, match="threads"):
        read._readahead.Reader(0)
    with pytest.raises(ValueError, match="null"):
        ReadAhead(1).submit("bad\0path")


# -- the loader's side ------------------------------------------------------------------------------


def test_sources_name_the_local_file_their_fetch_reads(tmp_path) -> None:
    (tmp_path / "cat").mkdir()
    _write(tmp_path / "cat" / "a.jpg", 100)
    folder = ImageFolder(str(tmp_path))
    assert folder.local_file(0) == os.path.join(str(tmp_path), "cat/a.jpg")
    files = FileListDataset([str(tmp_path / "cat" / "a.jpg")])
    assert files.local_file(0) == str(tmp_path / "cat" / "a.jpg")

    class Decrypting(ImageFolder):  # reads its own way: only its fetch knows how
        def fetch(self, index: int) -> bytes:
            return bytes(reversed(super().fetch(index)))

    assert Decrypting(str(tmp_path)).local_file(0) is None


def test_a_workers_storage_reads_of_local_files_go_through_the_read_ahead(tmp_path, monkeypatch) -> None:
    from coordl.datasets import synth

    root = synth.make_dataset(tmp_path / "data", n=48, classes=3)
    submitted = multiprocessing.get_context("fork").Value("i", 0)
    real_submit = ReadAhead.submit

    def counting(self, path, *, cached=True):
        with submitted.get_lock():
            submitted.value += 1
        return real_submit(self, path, cached=cached)

    monkeypatch.setattr(ReadAhead, "submit", counting)
    tf = coordl.transforms.eval_transform(32)
    gen = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    want = [
        (x.clone(), y.clone())
        for x, y in torch.utils.data.DataLoader(
            ImageFolder(str(root), tf), batch_size=8, shuffle=True, generator=gen()
        )
    ]
    with coordl.DataLoader(
        ImageFolder(str(root), tf), batch_size=8, shuffle=True, generator=gen(), num_workers=2,
        fetch_ahead=4, page_cache="bypass",
    ) as dl:  # fmt: skip
        got = list(dl)
    assert len(got) == len(want)
    for (x, y), (wx, wy) in zip(got, want, strict=True):
        assert torch.equal(x, wx) and torch.equal(y, wy)
    assert submitted.value > 0  # each worker's first reads go ahead (the pace starts pooled)

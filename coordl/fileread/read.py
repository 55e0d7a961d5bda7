"""Reading a whole file, optionally past the OS page cache (``O_DIRECT``).

A loader with a MinIO cache keeps the items it caches in its own shared memory; the items it does not
cache are read from storage again every epoch. When the part of the dataset outside the cache is larger
than the memory left for the page cache, the page cache cannot keep those reads until the next epoch:
every read inserts pages that are reclaimed before they are read again, and both cost CPU (measured:
0.03 ms per item of kernel time in a worker, and 0.07 cores of kernel threads, on the 2-core VM; see
``reports/bench_loader.md``). :func:`read_file` with ``cached=False`` reads such a file with
``O_DIRECT`` into a page-aligned buffer of its thread instead, so nothing is inserted or reclaimed.

File systems without ``O_DIRECT`` (tmpfs, some FUSE mounts) refuse it at ``open``; a file whose direct
read the kernel refuses (``EINVAL``: an encrypted or inline-data file) is read the ordinary way. Either
way the caller gets the same bytes. Files larger than :data:`DIRECT_MAX_BYTES` are always read the
ordinary way, so that no thread keeps a large buffer.
"""

from __future__ import annotations

import concurrent.futures
import errno
import mmap
import os
import threading
from typing import Any

try:
    # a C extension, which mypy cannot read and which has no stub: its names are Any
    from coordl.fileread import _readahead  # type: ignore[attr-defined]
except ImportError:  # built optionally (no C compiler at install time): ReadAhead uses Python threads
    _readahead = None

__all__ = ["DIRECT_MAX_BYTES", "ReadAhead", "read_file"]

DIRECT_MAX_BYTES = 64 << 20
_ALIGN = 4096  # a multiple of every block device's logical block size
_MIN_BUFFER = 1 << 20

_local = threading.local()
_no_direct: set[int] = set()  # st_dev of file systems that refused O_DIRECT (asked once per process)


def read_file(path: str | os.PathLike, *, cached: bool = True) -> bytes:
    """The whole content of ``path``; with ``cached=False``, read without leaving it in the page cache
    when the file system allows (else read as with ``cached=True``)."""
    if cached or not hasattr(os, "O_DIRECT"):
        return _read_cached(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise  # FileNotFoundError, PermissionError...: the same error as an ordinary read
        return _read_cached(path)  # the file system has no O_DIRECT (tmpfs)
    try:
        st = os.fstat(fd)
        if st.st_dev in _no_direct or st.st_size > DIRECT_MAX_BYTES:
            return _read_cached(path)
        try:
            return _read_direct(fd, st.st_size)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            _no_direct.add(st.st_dev)
            return _read_cached(path)
    finally:
        os.close(fd)


def _read_cached(path: str | os.PathLike) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _read_direct(fd: int, size: int) -> bytes:
    """Read ``fd`` to its end in aligned chunks (the file may have grown since ``fstat``)."""
    want = (size // _ALIGN + 1) * _ALIGN  # one block more than the size: a short read ends the file
    buf = _buffer(want)
    view = memoryview(buf)
    try:
        got = 0
        while True:
            n = os.preadv(fd, [view[got:want]], got)
            got += n
            if got < want:  # a short read (0 included): the end of the file
                return bytes(view[:got])
            if want >= DIRECT_MAX_BYTES:
                raise OSError(errno.EINVAL, "file grew past the direct-read limit while read")
            want *= 2  # it grew: read on into a larger buffer
            grown = _buffer(want)
            grown[:got] = buf[:got]
            buf, view = grown, memoryview(grown)
    finally:
        view.release()


def _buffer(size: int) -> mmap.mmap:
    """This thread's page-aligned read buffer, at least ``size`` bytes (anonymous mmap: aligned).

    Private to the process: ``mmap.mmap(-1, n)`` alone maps *shared* memory, which a forked loader
    worker inherits from the thread that forked it, so two workers read their files into the same
    pages and each got bytes of the other's file (a real race, found by a CI run: see the test).
    A forked child also drops the inherited buffer (:func:`_forget_buffer_after_fork`).
    """
    buf = getattr(_local, "buffer", None)
    if buf is None or len(buf) < size:
        buf = mmap.mmap(-1, max(size, _MIN_BUFFER), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        _local.buffer = buf
    return buf


def _forget_buffer_after_fork() -> None:
    """The forking thread's buffer is copied into the child as its main thread's: the child makes its own."""
    _local.__dict__.pop("buffer", None)


os.register_at_fork(after_in_child=_forget_buffer_after_fork)


class ReadAhead:
    """Whole files read ahead by ``threads`` threads of this process, as :func:`read_file` reads them.

    ``submit(path, cached=...)`` starts a read and returns its handle: ``result()`` waits for the bytes
    (or raises the read's ``OSError``, naming the file), ``cancel()`` drops it. A loader worker reads
    the next items' files this way while it preps the current one.

    With the extension ``coordl.fileread._readahead`` (``native``; coordl/fileread/readahead.c) the
    threads are native and never take the GIL: the bytes object is made by ``result()`` in the caller's
    thread. Python threads reading for a thread that preps take the GIL back after every read and every
    ``os`` call, and a prep thread that releases it around a C call (a torch op, the JPEG decoder) then
    waits to get it back (``reports/bench_loader.md``, issue 27 session 7). Without the extension, a pool
    of Python threads does the same reads.

    One per process: a reader's threads do not survive a fork (the native one refuses a submit there).
    """

    def __init__(self, threads: int) -> None:
        self.native = _readahead is not None
        if self.native:
            self._reader: Any = _readahead.Reader(threads)
        else:
            self._reader = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="coordl-read")

    def submit(self, path: str | os.PathLike, *, cached: bool = True) -> Any:
        """Start reading ``path`` (past the page cache with ``cached=False``, as :func:`read_file`)."""
        if self.native:
            return self._reader.submit(os.fspath(path), not cached)
        return self._reader.submit(read_file, path, cached=cached)

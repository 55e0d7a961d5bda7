"""One read-only LMDB environment per (data file, process), and reading a large value in one request.

* py-lmdb refuses to open a file twice in one process (LMDB's fcntl locks belong to the process), so
  every :class:`~coordl.packed.lmdb.LMDBDataset` on a file shares one environment. A forked child
  must not use its parent's: it closes its inherited copy (opened with ``lock=False``, so no lock
  file or reader slot is touched, only the child's mapping and descriptor) and opens its own.
* Copying a value out of the map faults its pages in one 4 KiB page at a time when read-ahead is
  off (``MADV_RANDOM``, right for random access): a 100 KB sample costs ~25 storage requests
  (measured on a throttled loop device: 435 reads for 20 records; ``MADV_WILLNEED`` on the range did
  not change that). A value larger than a page lives on consecutive *overflow pages*, whose first
  16 bytes are a header (page number, flags, page count; LMDB 0.9's on-disk format), so its file
  offset is known: :meth:`ProcessEnv.copy_value` reads it with one ``pread`` instead (one request),
  after checking that header, and falls back to the plain copy whenever a check fails. Limit found:
  past the first ~18 MB of the file those ``pread`` calls were still split page by page while the
  file is mapped (reports/bench_packed.md, "Open"); they return the right bytes either way.
"""

from __future__ import annotations

import ctypes
import os
import struct
from dataclasses import dataclass
from typing import Any

import lmdb
import numpy as np

from shmem.forklock import ForkSafeLock

__all__ = ["ProcessEnv", "process_env", "close_process_env"]

_PAGE_HEADER = struct.Struct("<QHHI")  # pgno, pad, flags, overflow page count
_P_OVERFLOW = 0x04


@dataclass
class ProcessEnv:
    """A process's environment of one data file, with a descriptor for ``pread`` of large values."""

    pid: int
    env: Any
    fd: int
    page_bytes: int
    file_bytes: int

    def copy_value(self, view: memoryview) -> bytes:
        """The bytes of ``view`` (a value inside the map): one ``pread`` for an overflow value."""
        if len(view) > self.page_bytes // 2:
            addr = np.frombuffer(view, dtype=np.uint8).ctypes.data
            if addr % self.page_bytes == _PAGE_HEADER.size:  # data right after an overflow page header
                pgno, _pad, flags, pages = _PAGE_HEADER.unpack(ctypes.string_at(addr - _PAGE_HEADER.size, 16))
                offset = pgno * self.page_bytes + _PAGE_HEADER.size
                fits = pages * self.page_bytes >= len(view) + _PAGE_HEADER.size
                if flags & _P_OVERFLOW and fits and offset + len(view) <= self.file_bytes:
                    data = os.pread(self.fd, len(view), offset)
                    if len(data) == len(view) and data[:64] == bytes(view[:64]):  # first page: resident
                        return data
        return bytes(view)

    def close(self) -> None:
        self.env.close()
        os.close(self.fd)


_envs: dict[str, ProcessEnv] = {}
_envs_lock = ForkSafeLock()  # a lock copied by fork may be held by one of the parent's threads


def process_env(data_path: str, subdir: bool, readahead: bool) -> ProcessEnv:
    """This process's environment of ``data_path`` (a real path), opened read-only on first use."""
    pid = os.getpid()
    found = _envs.get(data_path)
    if found is not None and found.pid == pid:
        return found
    with _envs_lock:
        found = _envs.get(data_path)
        if found is not None and found.pid == pid:
            return found
        if found is not None:  # inherited through fork
            found.close()
        env = lmdb.open(
            os.path.dirname(data_path) if subdir else data_path,
            subdir=subdir, readonly=True, lock=False, readahead=readahead, max_spare_txns=4,
        )  # fmt: skip
        fd = os.open(data_path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        if not readahead:  # pread exactly the value's pages, nothing around them
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        found = ProcessEnv(pid, env, fd, env.stat()["psize"], os.fstat(fd).st_size)
        _envs[data_path] = found
        return found


def close_process_env(data_path: str) -> None:
    """Close this process's environment of ``data_path`` (a real path), if it has one."""
    with _envs_lock:
        found = _envs.pop(data_path, None)
        if found is not None:
            found.close()

"""Named shared-memory segments that never leak and never bus-error.

Every segment coordl creates is a file named ``coordl-<kind>-<pid>-<start>-<token>`` in ``/dev/shm``
(or in a directory the user chooses, for a file-backed mapping when ``/dev/shm`` is small). The owner's
pid and process start time in the name let any later process tell a segment whose owner died (even by
``kill -9``) from one in use, so :func:`reclaim_stale` frees leftovers at the next start: leaked
segments after crashes are the top complaint users have about shared-memory loaders.

A pid means something only in its pid namespace. Containers started with ``--ipc=host`` (what PyTorch's
docs advise for DataLoader workers) share ``/dev/shm`` but not their pids: there, another container's
live owner looks dead (its pid is absent, or another process's). So the start value carries the
owner's pid namespace (:func:`start_ticks`), and a process judges only owners of its own namespace:
one from another namespace is taken as alive, and its files are left for its own namespace to reclaim.

The file is created sparse and its pages are reserved with ``posix_fallocate`` before anything is
written to them (:meth:`Segment.reserve`). On tmpfs, touching an unreserved page when the file system
is full raises SIGBUS ("DataLoader worker is killed by signal: Bus error"); reserving first turns that
into a clean ``False`` that callers treat as "cache full".
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import functools
import mmap
import os
import re
import secrets
import time
import weakref
from pathlib import Path

import numpy as np
import numpy.typing as npt
import psutil

__all__ = [
    "DEFAULT_DIR",
    "SEGMENT_NAME_RE",
    "Segment",
    "flock_timeout",
    "free_bytes",
    "owner_alive",
    "owner_tag",
    "reclaim_stale",
    "start_ticks",
]

DEFAULT_DIR = "/dev/shm"
# coordl-<kind>-<owner pid>-<owner start ticks>[-for-<reader pid>-<reader start ticks>]-<token>: a stale
# segment names its dead owner, and the reader it was made for (when there is one) is dead too.
SEGMENT_NAME_RE = re.compile(
    r"^coordl-(?P<kind>[a-z0-9_]+)-(?P<pid>\d+)-(?P<start>\d+)(?:-for-(?P<rpid>\d+)-(?P<rstart>\d+))?"
    r"-(?P<token>[0-9a-f]+)$"
)


_TICK_BITS = 40  # centiseconds since 1970 fit in 40 bits until the 2310s
_TICKS = (1 << _TICK_BITS) - 1


def _pid_namespace() -> int:
    """22 bits of this process's pid namespace inode (0 where /proc does not say): 62 bits in all."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino & 0x3FFFFF
    except OSError:
        return 0


_NAMESPACE = _pid_namespace()


def start_ticks(pid: int) -> int:
    """Process start time in centiseconds, with this process's pid namespace above it (``pid`` is a pid
    of that namespace): with the pid, it names a process uniquely, wherever it is read."""
    return (_NAMESPACE << _TICK_BITS) | (int(psutil.Process(pid).create_time() * 100) & _TICKS)


def owner_tag(pid: int | None = None) -> str:
    """``<pid>-<start>`` of a process (default: this one)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{start_ticks(pid)}"


def owner_alive(pid: int, start: int) -> bool:
    """Whether the process that had ``start_ticks`` == ``start`` under ``pid`` still runs (not a reuse).

    A zombie (exited, not yet reaped by its parent: a container's PID 1, a launcher) is not alive: its
    ``/proc`` entry keeps the start time, but it will never use or free anything again. A process of
    another pid namespace (another container sharing ``/dev/shm``) cannot be judged from here: alive.
    """
    namespace = start >> _TICK_BITS
    if namespace and namespace != _NAMESPACE:
        return True
    try:
        proc = psutil.Process(pid)
        # Start times are rounded; allow one tick of slack.
        ticks = int(proc.create_time() * 100) & _TICKS
        return abs(ticks - (start & _TICKS)) <= 1 and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
        return False


def free_bytes(directory: str | os.PathLike = DEFAULT_DIR) -> int:
    """Bytes still available to an unprivileged writer in ``directory``'s file system."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def _can_back(directory: str, length: int) -> bool:
    """Whether ``length`` new bytes fit in ``directory``'s free space and, on tmpfs, in available memory."""
    if length > free_bytes(directory):
        return False
    return not _is_tmpfs(directory) or length <= psutil.virtual_memory().available


@functools.lru_cache(maxsize=64)
def _is_tmpfs(directory: str) -> bool:
    """``directory`` lies on a memory-backed file system (the longest mount point above it decides)."""
    real = os.path.realpath(directory)
    best, fstype = "", ""
    for part in psutil.disk_partitions(all=True):
        mount = part.mountpoint.rstrip("/") or "/"
        inside = real == mount or real.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) > len(best):
            best, fstype = mount, part.fstype
    return fstype in ("tmpfs", "shm", "ramfs")


def flock_timeout(fd: int, timeout_s: float, what: str) -> None:
    """Take an exclusive ``flock`` on ``fd``, polling, or raise TimeoutError naming ``what``.

    ``flock`` is dropped by the kernel when its holder dies, so a wait only outlasts a live holder.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not acquired in {timeout_s:.0f} s") from None
            time.sleep(0.0005)


def reclaim_stale(directory: str | os.PathLike = DEFAULT_DIR) -> list[str]:
    """Delete coordl segments in ``directory`` whose owning process is gone. Returns their paths."""
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    for name in names:
        m = SEGMENT_NAME_RE.match(name)
        if m is None or owner_alive(int(m["pid"]), int(m["start"])):
            continue
        if m["rpid"] is not None and owner_alive(int(m["rpid"]), int(m["rstart"])):
            continue  # its reader may still map it (a batch its dead writer sent, still in a queue)
        path = os.path.join(directory, name)
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            pass  # another process reclaimed it first
    return removed


def _unlink_if_owner(path: str, owner_pid: int) -> None:
    # A forked child inherits the owner's finalizer; only the owning process may remove the name.
    if os.getpid() != owner_pid:
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class Segment:
    """A shared mapping of a file in ``/dev/shm`` (or another directory).

    Create one with :meth:`create` in the owning process; other processes get it by pickling (only
    the path travels) or :meth:`attach`. Only the creating process unlinks it, at :meth:`unlink`,
    interpreter exit or garbage collection.
    """

    def __init__(self, path: str, size: int, *, owner: bool) -> None:
        self.path = path
        self.size = size
        self._fd = os.open(path, os.O_RDWR)
        self._mmap: mmap.mmap | None = mmap.mmap(
            self._fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
        )
        self.buf = memoryview(self._mmap)
        self._owner_pid: int | None = None
        self._finalizer: weakref.finalize | None = None
        if owner:
            self._owner_pid = os.getpid()
            self._finalizer = weakref.finalize(self, _unlink_if_owner, path, self._owner_pid)
            atexit.register(self._finalizer)

    @classmethod
    def create(
        cls, kind: str, size: int, directory: str | os.PathLike = DEFAULT_DIR, *, reader: str | None = None
    ) -> Segment:
        """Create a sparse segment of ``size`` bytes. Reclaims stale segments in ``directory`` first.

        ``reader``: the :func:`owner_tag` of the process that will map it after this one may have died
        (a loader worker's batch ring, read by the main process): the segment is stale only once both are gone.
        """
        if not re.fullmatch(r"[a-z0-9_]+", kind):
            raise ValueError(f"segment kind must be lowercase alphanumeric, got {kind!r}")
        directory = os.fspath(directory)
        Path(directory).mkdir(parents=True, exist_ok=True)
        reclaim_stale(directory)
        for_reader = f"-for-{reader}" if reader is not None else ""
        path = os.path.join(directory, f"coordl-{kind}-{owner_tag()}{for_reader}-{secrets.token_hex(4)}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, max(size, 1))
        finally:
            os.close(fd)
        return cls(path, max(size, 1), owner=True)

    @classmethod
    def attach(cls, path: str) -> Segment:
        """Map an existing segment (no ownership: this process will not unlink it)."""
        return cls(path, os.stat(path).st_size, owner=False)

    @classmethod
    def inherited(cls, path: str, fd: int, mapping: mmap.mmap) -> Segment:
        """In a forked child: the segment its parent had open as ``fd`` and mapped as ``mapping``.

        Works after the name was unlinked (the parent's descriptor and mapping survive the fork);
        no ownership, so this process never unlinks it.
        """
        seg = cls.__new__(cls)
        seg.path, seg.size, seg._fd, seg._mmap = path, len(mapping), fd, mapping
        seg.buf = memoryview(mapping)
        seg._owner_pid, seg._finalizer = None, None
        return seg

    def reserve(self, offset: int, length: int) -> bool:
        """Back ``[offset, offset+length)`` with real pages. False when the file system is full.

        Also False, before any page is taken, when the range cannot be backed: more than the file system's
        free space, or (on tmpfs) more than the memory available. A tmpfs as large as RAM (``/dev/shm`` on
        many machines) would otherwise let ``fallocate`` take every page and the kernel's OOM killer end the
        process instead of this call failing.
        """
        if length <= 0:
            return True
        if not _can_back(os.path.dirname(self.path), length):
            return False
        try:
            os.posix_fallocate(self._fd, offset, length)
            return True
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
                return False
            raise

    def array(self, dtype: npt.DTypeLike, offset: int, count: int) -> np.ndarray:
        """A NumPy view of ``count`` elements of ``dtype`` at byte ``offset``."""
        if self._mmap is None:
            raise ValueError(f"shared-memory segment {self.path} is closed")
        return np.frombuffer(self._mmap, dtype=dtype, count=count, offset=offset)

    def fileno(self) -> int:
        return self._fd

    def reopen(self) -> int:
        """A new read-only descriptor of this segment with an open file description of its own (flock
        locks belong to one), opened through this process's descriptor, so it works after the owner
        unlinked the name (a node's ranks keep using a cache its creator closed first)."""
        try:
            return os.open(f"/proc/self/fd/{self._fd}", os.O_RDONLY)
        except FileNotFoundError:  # no /proc mounted
            return os.open(self.path, os.O_RDONLY)

    def close(self) -> None:
        """Unmap (and, in the owner, unlink). Views handed out earlier must be dropped first."""
        if self._mmap is None:
            return
        self.buf.release()
        try:
            self._mmap.close()
        except BufferError:
            pass  # a NumPy view still references it; the OS frees it at exit
        os.close(self._fd)
        self._mmap = None
        if self._owner_pid == os.getpid():
            self.unlink()

    def unlink(self) -> None:
        """Remove the name (owner only); existing mappings stay valid until closed."""
        if self._owner_pid == os.getpid() and self._finalizer is not None:
            self._finalizer()

    @property
    def is_owner(self) -> bool:
        return self._owner_pid == os.getpid()

    def __getstate__(self) -> dict:
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        path = state["path"]
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            raise FileNotFoundError(
                2,
                f"shared-memory segment {path} is gone: the process that made it closed it or exited "
                "before this process (a spawned worker) could attach",
                path,
            ) from None
        type(self).__init__(self, path, size, owner=False)

    def __repr__(self) -> str:
        return f"Segment({self.path!r}, size={self.size})"

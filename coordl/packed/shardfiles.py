"""Where :class:`coordl.TarShards`' shard files are (:class:`ShardFiles`) and how this process reads
byte ranges of them (:class:`ShardReads`).

Three places behind one read: a local directory (``pread`` of the shard file), staged copies
(``nfs_cache.StagedSource`` copies a shard whole to local disk on its first read, then ``pread`` of the
copy) and a bucket (:class:`coordl.objectstore.shards.ShardBuffer` keeps whole shards in memory: one GET
per shard, and with a :class:`coordl.ShardSampler` the next shards of this reader's stream fetched ahead).
A shard's index is found beside it, in ``index_dir``, uploaded with it, or built from a local copy.

Descriptors are per process: a forked child closes its inherited copies (they share the parent's file
offsets) and opens its own, once, however many of its fetch-ahead threads arrive first.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from coordl.packed.shards import (
    INDEX_SUFFIX,
    ShardIndex,
    build_index,
    load_index,
    load_uploaded_index,
    save_index,
)
from shmem.forklock import ForkSafeLock

if TYPE_CHECKING:  # imported where used, lazily: only bucket or staged shards need them
    from coordl.objectstore.shards import ShardBuffer
    from coordl.objectstore.source import S3Source
    from nfs_cache import StagedSource

__all__ = ["DEFAULT_MAX_OPEN_SHARDS", "ShardFiles", "ShardReads"]

log = logging.getLogger("coordl.tar")

# Guards the switch to a forked child's own descriptors: several fetch-ahead threads of a new worker
# reach it at once. Made anew in each child (a lock copied by fork may be held by a parent's thread).
_fork_lock = ForkSafeLock()

# Shards kept open per process; reads of further shards open and close their file each time
# (never closing a descriptor another thread may be reading from).
DEFAULT_MAX_OPEN_SHARDS = 256

_PROCESS_STATE = ("_fds", "_fd_lock", "_local_shards", "_plan_front", "_fd_pid")


def _worker_stream(n_streams: int, default: int) -> int:
    """The sampler's stream this loader worker reads (torch hands batch ``b`` to worker ``b % num_workers``);
    ``default`` outside a worker or when the loader's workers are not the sampler's."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    if info is None or n_streams < 2 or info.num_workers != n_streams:
        return default
    return info.id


class ShardFiles:
    """The shard files of one :class:`coordl.TarShards`: where they are, their listing and their indexes.

    ``staged`` (an ``nfs_cache.StagedSource``), ``bucket`` (an :class:`~coordl.objectstore.source.S3Source`)
    and ``buffer`` (its :class:`~coordl.objectstore.shards.ShardBuffer`) are None where they do not apply.
    The arguments are :class:`coordl.TarShards`'; ``pattern`` names the dataset in messages and
    ``directory`` is the shard directory (a path or a URL).
    """

    def __init__(
        self,
        pattern: str,
        directory: str,
        *,
        index_dir: str | None,
        stage_dir: Any,
        stage_budget_bytes: int | None,
        prefetch: bool,
        max_open_shards: int,
        storage_options: dict[str, Any] | None,
        memory_shards: int | None,
    ) -> None:
        self.pattern, self.directory, self.index_dir = pattern, directory, index_dir
        self.max_open_shards = max_open_shards
        self.names: list[str] = []
        self.staged: StagedSource | None = None
        self.bucket: S3Source | None = None
        self.buffer: ShardBuffer | None = None
        if directory.lower().startswith(("s3://", "s3a://")):
            self._open_bucket(storage_options, memory_shards, stage_dir)
        if stage_dir is not None or ("://" in directory and self.bucket is None):
            self._open_staged(stage_dir, stage_budget_bytes, prefetch)
        self.listing = self._list()

    def _open_bucket(self, storage_options: Any, memory_shards: int | None, stage_dir: Any) -> None:
        from coordl.objectstore.shards import DEFAULT_MEMORY_SHARDS, ShardBuffer
        from coordl.objectstore.source import S3Source

        self.bucket = S3Source(self.directory, storage_options)
        self.buffer = ShardBuffer(self.bucket.read, memory_shards or DEFAULT_MEMORY_SHARDS)
        if stage_dir is None and self.index_dir is None:
            from coordl.objectstore.listing import default_cache_dir

            digest = hashlib.sha256(self.directory.encode()).hexdigest()[:16]
            self.index_dir = os.path.join(os.path.dirname(default_cache_dir()), "tar-index", digest)

    def _open_staged(self, stage_dir: Any, budget: int | None, prefetch: bool) -> None:
        if stage_dir is None:
            raise ValueError(
                f"TarShards({self.pattern!r}): a URL pattern needs stage_dir= (a local directory)"
            )
        from nfs_cache import StagedSource  # lazy: only staged shards need it
        from shmem.counters import SharedCounters

        self.staged = StagedSource(
            self.bucket or self.directory, os.fspath(stage_dir), budget_bytes=budget, prefetch=prefetch,
            counters=SharedCounters(["remote_bytes_read"]),
        )  # fmt: skip
        if (
            self.buffer is not None
        ):  # one GET per shard: staged whole when the budget has room, else in memory
            self.buffer.fetch = self.staged.read
        if self.index_dir is None:
            self.index_dir = os.path.join(os.fspath(stage_dir), "tar-index")

    def _list(self) -> dict[str, tuple[int, int]]:
        """name -> (size, mtime_ns) of the files directly in the shard directory."""
        if self.bucket is not None and self.staged is None:
            return {f.relpath: (f.size, f.mtime_ns) for f in self.bucket.list_files() if "/" not in f.relpath}
        if self.staged is None:
            if not os.path.isdir(self.directory):
                raise FileNotFoundError(f"TarShards: {self.directory} is not a directory")
            out = {}
            for entry in os.scandir(self.directory):
                if entry.is_file():
                    st = entry.stat()
                    out[entry.name] = (st.st_size, st.st_mtime_ns)
            return out
        self.staged.list_files()  # also forgets staged copies of shards that changed
        return {
            f.relpath: (f.size, f.mtime_ns) for f in self.staged.source.list_files() if "/" not in f.relpath
        }

    def use(self, names: Sequence[str], read_ahead_bytes: int | None) -> None:
        """The shards the dataset reads, in its order (shard ``s`` is ``names[s]``)."""
        self.names = list(names)
        if self.buffer is not None:
            self.buffer.sizes = {n: self.listing[n][0] for n in self.names}
            largest = max(self.buffer.sizes.values())
            self.buffer.ahead_bytes = 2 * largest if read_ahead_bytes is None else int(read_ahead_bytes)
            if self.staged is not None:
                self.buffer.is_local = self.staged.is_staged

    def where(self, name: str) -> str:
        """The shard named for a reader: its URL, staged source's name or path."""
        if self.bucket is not None:
            return self.bucket.describe(name)
        return self.staged.describe(name) if self.staged is not None else os.path.join(self.directory, name)

    # -- indexes ------------------------------------------------------------------------------------

    def find_index(self, name: str, extensions: tuple[str, ...]) -> ShardIndex:
        """The shard's index: beside it, else in ``index_dir``, else built (and stored where possible)."""
        size, mtime_ns = self.listing[name]
        beside = name + INDEX_SUFFIX
        candidates = []
        if self.staged is None and self.bucket is None:
            candidates.append(os.path.join(self.directory, beside))
        if self.index_dir is not None:
            candidates.append(os.path.join(self.index_dir, beside))
        for path in candidates:
            try:
                with open(path, "rb") as f:
                    found = load_index(f.read(), size, mtime_ns, extensions)
            except OSError:  # absent, or not a readable file: build it
                continue
            if found is not None:
                return found
        if self.bucket is not None and beside in self.listing:  # uploaded with its shard: checked by size
            found = load_uploaded_index(self.bucket.read(beside), size, extensions)
            if found is not None:
                return found
        elif self.staged is not None and beside in self.listing:
            found = load_index(self.staged.read(beside), size, mtime_ns, extensions)
            if found is not None:
                return found
        return self._build_and_store(name, mtime_ns, candidates, extensions)

    def _build_and_store(
        self, name: str, mtime_ns: int, candidates: list[str], extensions: tuple[str, ...]
    ) -> ShardIndex:
        path = self._local_copy(name)
        try:
            index = build_index(path, extensions, mtime_ns, keep_partial=True)
        finally:
            if path.endswith(".tmp"):  # the temporary copy of a bucket's shard
                os.unlink(path)
        for path in candidates:
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                save_index(index, path, extensions)
                return index
            except OSError:
                continue
        log.warning("coordl: no writable place for the index of %s: it is rebuilt on every start", name)
        return index

    def _local_copy(self, name: str) -> str:
        """A local path to the shard's bytes (staging it first when staged; a temporary copy from a bucket)."""
        if self.bucket is not None:  # through the buffer: one GET, staged whole if the budget has room
            # made by _open_bucket (index_dir by _open_staged when stage_dir was given)
            assert self.buffer is not None and self.index_dir is not None
            os.makedirs(self.index_dir, exist_ok=True)
            tmp = os.path.join(self.index_dir, f".{name}.{os.getpid()}.tmp")
            with open(tmp, "wb") as f:
                f.write(self.buffer.get(name))
            return tmp
        if self.staged is None:
            return os.path.join(self.directory, name)
        if not self.staged.is_staged(name):
            self.staged.read(name)
        if not self.staged.is_staged(name):
            raise OSError(
                f"{self.where(name)}: cannot index an unstaged shard ({self.staged.staging_stopped})"
            )
        return self.staged.local_path(name)

    def local_shards(self) -> list[int]:
        """Shards read from a local staged copy (none when nothing is staged)."""
        if self.staged is None:
            return []
        return [s for s, name in enumerate(self.names) if self.staged.is_staged(name)]

    def storage_files(self) -> list[str]:
        """The files read from (the shards; their staged copies when staged)."""
        if self.staged is None:
            return [os.path.join(self.directory, n) for n in self.names]
        return [self.staged.local_path(n) for n in self.names if self.staged.is_staged(n)]

    def stats(self) -> dict[str, int]:
        """Staging counters and a bucket's; empty for local shards."""
        out: dict[str, int] = dict(self.staged.stats()) if self.staged is not None else {}
        if self.bucket is not None:
            out.update(self.bucket.stats())
        return out


class ShardReads:
    """Byte ranges of shards, read in this process: ``pread`` of a shard file kept open (its staged copy,
    staged on first use), or a slice of a bucket's shard held in memory, with the next shards of this
    reader's stream fetched ahead along the sampler's plan (:meth:`attach_plan`).

    Pickled for spawned workers without its descriptors; a forked copy opens its own on first read.
    """

    def __init__(self, files: ShardFiles) -> None:
        self.files = files
        self.plan: Any = None
        self._init_process_state()

    def _init_process_state(self) -> None:
        for fd in getattr(self, "_fds", {}).values():  # a forked child's copies of the parent's files
            os.close(fd)
        self._fds: dict[int, int] = {}
        self._fd_lock = threading.Lock()
        self._local_shards: set[int] = set()
        self._plan_front: dict[tuple[int, int], int] = {}  # (epoch, stream) -> furthest shard read ahead from
        self._fd_pid = os.getpid()  # last: a thread that sees this pid finds the fresh state above

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in _PROCESS_STATE}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_process_state()

    def read(self, s: int, offset: int, size: int) -> bytes:
        """``size`` bytes of shard ``s`` from ``offset`` (fewer where the shard is cut short)."""
        files = self.files
        foreign = self.plan is not None and self._read_ahead(s)
        if files.buffer is not None and not self._has_local(s):
            name = files.names[s]
            if foreign and not files.buffer.holds(name):  # the epoch's tail: this sample only, one ranged GET
                assert files.bucket is not None  # the buffer reads from it (made together in _open_bucket)
                return files.bucket.read_range(name, offset, size)
            return files.buffer.slice(name, offset, size)
        fd, owned = self._fd(s)
        try:
            return os.pread(fd, size, offset)
        finally:
            if not owned:
                os.close(fd)

    def _shard_path(self, s: int) -> str:
        """Local path to read shard ``s`` from (staged copy, staging it on first use, or the source)."""
        staged, name = self.files.staged, self.files.names[s]
        if staged is None:
            return os.path.join(self.files.directory, name)
        if s in self._local_shards:
            return staged.local_path(name)
        if not staged.is_staged(name):
            staged.read(name)  # stages the whole shard (unless the budget or the disk is full)
        if staged.is_staged(name):
            self._local_shards.add(s)
            return staged.local_path(name)
        local_root = getattr(staged.source, "root", None)
        if local_root is None:
            raise OSError(
                f"{self.files.where(name)}: staging stopped ({staged.staging_stopped}) and this source "
                "cannot read byte ranges: raise stage_budget_bytes or free space in stage_dir"
            )
        return os.path.join(local_root, name)  # a mounted directory: read the range there

    def _fd(self, s: int) -> tuple[int, bool]:
        """(descriptor, owned): owned descriptors stay open for later reads."""
        if self._fd_pid != os.getpid():  # a forked copy: the parent's descriptors share its file offsets
            with _fork_lock:  # once per child, though its fetch-ahead threads all arrive here first
                if self._fd_pid != os.getpid():
                    self._init_process_state()
        fd = self._fds.get(s)
        if fd is not None:
            return fd, True
        path = self._shard_path(s)
        with self._fd_lock:
            fd = self._fds.get(s)
            if fd is not None:
                return fd, True
            new = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            # Samples are read at random offsets: read-ahead would fetch neighbours never asked for
            # (measured on a throttled disk: 24-38% slower than loose files without this).
            os.posix_fadvise(new, 0, 0, os.POSIX_FADV_RANDOM)
            if len(self._fds) < self.files.max_open_shards:
                self._fds[s] = new
                return new, True
            return new, False

    def _has_local(self, s: int) -> bool:
        """True when shard ``s`` is (or can now be) read from a local staged copy."""
        staged = self.files.staged
        if staged is None:
            return False
        if s in self._local_shards:
            return True
        if staged.is_staged(self.files.names[s]):
            self._local_shards.add(s)
            return True
        return False  # the buffer's fetch (StagedSource.read) stages it whole if the budget has room

    def wants_plan(self) -> bool:
        """True when whole shards are streamed from a bucket and fetched ahead."""
        return self.files.buffer is not None and self.files.buffer.ahead_bytes > 0

    def attach_plan(self, plan: Any) -> None:
        """The sampler's :class:`~coordl.packed.shard_sampler.ShardPlan`: which shards each reader reads next."""
        self.plan = plan

    def _read_ahead(self, s: int) -> bool:
        """On reaching a shard further along this reader's stream, name the shards after it to the buffer.

        True when ``s`` is in another loader worker's stream: the sampler hands a worker whose shards ran out
        the last samples of another's, and fetching that shard whole would GET it twice in the epoch (8-16 MB
        of 90 measured); the caller reads those few samples by range instead (when no staged copy serves).
        """
        found = self.plan.locate(s)
        if found is None:
            return False
        epoch, stream, position = found
        if stream != _worker_stream(self.plan.n_streams, stream):
            return True
        if self._plan_front.get((epoch, stream), -1) >= position:
            return False  # samples of a window interleave: only a step forward renews the list
        self._plan_front[(epoch, stream)] = position
        # from this shard's window on: its shards may wait fetched ahead and unread, and must not be dropped
        buffer = self.files.buffer
        assert buffer is not None  # a plan is attached only when wants_plan() saw a buffer
        buffer.want([self.files.names[t] for t in self.plan.ahead_of(stream, position)])
        return False

    def close(self) -> None:
        """Close the shard files this process holds open and stop fetching shards ahead."""
        if self.files.buffer is not None:
            self.files.buffer.close()
        with self._fd_lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

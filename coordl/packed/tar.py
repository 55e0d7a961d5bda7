"""``coordl.TarShards``: WebDataset-layout tar shards read at random through per-shard indexes.

Loose small files cost one open/stat/read round trip each on network storage; a shard is one big
file read with ``pread`` at known offsets. Layout (WebDataset's): each sample is consecutive members
sharing a *key*, ``key.jpg`` (the encoded image; any of ``extensions``) and ``key.cls`` (the label as
an ASCII integer). The offsets come from a :class:`~coordl.packed.shards.ShardIndex` per shard, built
once by a sequential pass over the tar headers and stored beside the shard as ``<shard>.idx``
(rebuilt when the shard's size or mtime changes). Where the shard directory is read-only the index
is kept in ``index_dir`` (default: under the stage directory, else in memory only, with a warning).

``fetch(i)`` is one ``pread`` of the data member (thread-safe: no shared file position); ``prep``
is :class:`coordl.ImageFolder`'s. With ``stage_dir=`` (or an ``nfs://`` pattern) shards are staged
whole through ``nfs_cache.StagedSource``: the first read of any sample of a shard copies the shard
to local disk, later reads ``pread`` the local copy. An ``s3://`` pattern without ``stage_dir`` streams
whole shards through :class:`coordl.objectstore.shards.ShardBuffer` (one GET per shard, not one per sample;
pair it with :class:`coordl.ShardSampler` so reads stay within a few shards at a time). With that sampler,
each process also fetches the next shards of its stream ahead of use (``read_ahead_bytes``), so the link keeps
working while the current shards' samples are decoded.

Why this module is long: one class reads shards from three places (local, staged, bucket) behind one fetch.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from coordl.datasets.files import IMG_EXTENSIONS, _FileSource
from coordl.errors import CorruptItemError
from coordl.packed.shards import (
    INDEX_SUFFIX,
    NO_LABEL,
    ShardIndex,
    TruncatedShardError,
    build_index,
    expand_braces,
    load_index,
    load_uploaded_index,
    save_index,
)
from shmem.forklock import ForkSafeLock

__all__ = ["TarShards", "TruncatedShardError"]

log = logging.getLogger("coordl.tar")

# Guards the switch to a forked child's own descriptors: several fetch-ahead threads of a new worker
# reach it at once. Made anew in each child (a lock copied by fork may be held by a parent's thread).
_fork_lock = ForkSafeLock()

# Shards kept open per process; reads of further shards open and close their file each time
# (never closing a descriptor another thread may be reading from).
DEFAULT_MAX_OPEN_SHARDS = 256


def _split_pattern(pattern: str) -> tuple[str, str]:
    """(directory or URL of the directory, file-name pattern); URL options stay on the directory."""
    if "://" in pattern:
        parts = urllib.parse.urlsplit(pattern)
        directory, _, name = parts.path.rpartition("/")
        if not name.endswith(".tar"):  # a URL of the shard directory itself
            return pattern, ""
        return parts._replace(path=directory).geturl(), name
    if os.path.isdir(pattern):
        return pattern, ""
    directory, name = os.path.split(pattern)
    return directory or ".", name


def _worker_stream(n_streams: int, default: int) -> int:
    """The sampler's stream this loader worker reads (torch hands batch ``b`` to worker ``b % num_workers``);
    ``default`` outside a worker or when the loader's workers are not the sampler's."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    if info is None or n_streams < 2 or info.num_workers != n_streams:
        return default
    return info.id


class TarShards(_FileSource):
    """Samples of WebDataset-layout tar shards (``key.jpg`` + ``key.cls``), in shard then member order.

    Args:
        pattern: ``"dir/data-{000000..000099}.tar"`` (brace ranges and ``{a,b}`` lists), a directory
            (every ``*.tar`` in it, sorted), or the same as an ``nfs://`` URL (needs ``stage_dir``).
        transform: gets the raw bytes (default: decode to an HWC uint8 array), as in ImageFolder.
        target_transform: applied to the label.
        extensions: which member extensions hold the sample (the first found for a key).
        stage_dir: stage whole shards onto this local directory on first use (nfs_cache).
        stage_budget_bytes: stop staging past this many bytes; further shards are read remotely.
        prefetch: stage every shard in a background process while training reads.
        index_dir: where indexes go when the shard directory is not writable (see module docstring).
        truncated: "raise" (default): a truncated shard is an error naming shard, member and offset;
            "skip": index the complete samples before the cut and log how many were lost.
        max_open_shards: shard files kept open per process.
        storage_options: endpoint and credentials for an ``s3://`` pattern (default: environment, AWS config).
        memory_shards: whole shards each process keeps in memory when streaming from a bucket.
        read_ahead_bytes: with a :class:`coordl.ShardSampler`, bytes of the next shards each process fetches
            from a bucket ahead of use, held apart from the ``memory_shards`` in use (None: twice the largest
            shard, one window of the default sampler; 0: never fetch ahead). Staged shards are never fetched.
    """

    def __init__(
        self,
        pattern: str | os.PathLike,
        transform: Callable | None = None,
        target_transform: Callable | None = None,
        *,
        extensions: Sequence[str] = IMG_EXTENSIONS,
        stage_dir: str | os.PathLike | None = None,
        stage_budget_bytes: int | None = None,
        prefetch: bool = False,
        index_dir: str | os.PathLike | None = None,
        truncated: str = "raise",
        max_open_shards: int = DEFAULT_MAX_OPEN_SHARDS,
        storage_options: dict[str, Any] | None = None,
        memory_shards: int | None = None,
        read_ahead_bytes: int | None = None,
    ) -> None:
        super().__init__(transform, target_transform)
        if truncated not in ("raise", "skip"):
            raise ValueError(f"TarShards: truncated must be 'raise' or 'skip', got {truncated!r}")
        self.pattern = os.fspath(pattern)
        self.extensions = tuple(e.lower().lstrip(".") for e in extensions)
        self.truncated = truncated
        self.max_open_shards = max_open_shards
        self.directory, name_pattern = _split_pattern(self.pattern)
        self._staged = self._bucket = self._buffer = None
        self.index_dir = os.fspath(index_dir) if index_dir is not None else None
        if self.directory.lower().startswith(("s3://", "s3a://")):
            self._open_bucket(storage_options, memory_shards, stage_dir)
        if stage_dir is not None or ("://" in self.directory and self._bucket is None):
            self._open_staged(stage_dir, stage_budget_bytes, prefetch)
        remote = self._remote = self._list_remote()
        names = (
            sorted(n for n in remote if n.endswith(".tar"))
            if not name_pattern
            else expand_braces(name_pattern)
        )
        missing = [n for n in names if n not in remote]
        if missing or not names:
            raise FileNotFoundError(
                f"TarShards({self.pattern!r}): {len(missing)} of {len(names)} shards missing, e.g. "
                f"{self._where(missing[0]) if missing else self.directory + '/*.tar'}"
            )
        self.shards = names
        if self._buffer is not None:
            self._buffer.sizes = {n: remote[n][0] for n in names}
            largest = max(self._buffer.sizes.values())
            self._buffer.ahead_bytes = 2 * largest if read_ahead_bytes is None else int(read_ahead_bytes)
            if self._staged is not None:
                self._buffer.is_local = self._staged.is_staged
        self._plan = None
        indexes = [self._index(name, *remote[name]) for name in names]
        self._build_tables(indexes)
        self._init_local_state()

    # -- construction -----------------------------------------------------------------------------

    def _open_bucket(self, storage_options: Any, memory_shards: int | None, stage_dir: Any) -> None:
        from coordl.objectstore.shards import DEFAULT_MEMORY_SHARDS, ShardBuffer
        from coordl.objectstore.source import S3Source

        self._bucket = S3Source(self.directory, storage_options)
        self._buffer = ShardBuffer(self._bucket.read, memory_shards or DEFAULT_MEMORY_SHARDS)
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

        self._staged = StagedSource(
            self._bucket or self.directory, os.fspath(stage_dir), budget_bytes=budget, prefetch=prefetch,
            counters=SharedCounters(["remote_bytes_read"]),
        )  # fmt: skip
        if (
            self._buffer is not None
        ):  # one GET per shard: staged whole when the budget has room, else in memory
            self._buffer.fetch = self._staged.read
        if self.index_dir is None:
            self.index_dir = os.path.join(os.fspath(stage_dir), "tar-index")

    def _list_remote(self) -> dict[str, tuple[int, int]]:
        """name -> (size, mtime_ns) of the files directly in the shard directory."""
        if self._bucket is not None and self._staged is None:
            return {
                f.relpath: (f.size, f.mtime_ns) for f in self._bucket.list_files() if "/" not in f.relpath
            }
        if self._staged is None:
            if not os.path.isdir(self.directory):
                raise FileNotFoundError(f"TarShards: {self.directory} is not a directory")
            out = {}
            for entry in os.scandir(self.directory):
                if entry.is_file():
                    st = entry.stat()
                    out[entry.name] = (st.st_size, st.st_mtime_ns)
            return out
        self._staged.list_files()  # also forgets staged copies of shards that changed
        return {
            f.relpath: (f.size, f.mtime_ns) for f in self._staged.source.list_files() if "/" not in f.relpath
        }

    def _where(self, name: str) -> str:
        if self._bucket is not None:
            return self._bucket.describe(name)
        return self._staged.describe(name) if self._staged is not None else os.path.join(self.directory, name)

    def _index(self, name: str, size: int, mtime_ns: int) -> ShardIndex:
        """The shard's index: beside it, else in ``index_dir``, else built (and stored where possible)."""
        beside = name + INDEX_SUFFIX
        candidates = []
        if self._staged is None and self._bucket is None:
            candidates.append(os.path.join(self.directory, beside))
        if self.index_dir is not None:
            candidates.append(os.path.join(self.index_dir, beside))
        for path in candidates:
            try:
                with open(path, "rb") as f:
                    found = load_index(f.read(), size, mtime_ns, self.extensions)
            except OSError:  # absent, or not a readable file: build it
                continue
            if found is not None:
                return self._check_cut(name, found)
        if self._bucket is not None and beside in self._remote:  # uploaded with its shard: checked by size
            found = load_uploaded_index(self._bucket.read(beside), size, self.extensions)
            if found is not None:
                return self._check_cut(name, found)
        elif self._staged is not None and beside in self._remote:
            found = load_index(self._staged.read(beside), size, mtime_ns, self.extensions)
            if found is not None:
                return self._check_cut(name, found)
        return self._check_cut(name, self._build_and_store(name, mtime_ns, candidates))

    def _check_cut(self, name: str, index: ShardIndex) -> ShardIndex:
        """A truncated shard raises, or with ``truncated="skip"`` keeps what precedes the cut (logged)."""
        if index.cut and self.truncated == "raise":
            raise TruncatedShardError(
                f"{index.cut} (TarShards(truncated='skip') keeps the samples before it)"
            )
        if index.cut:
            log.warning("coordl: %s: %d samples kept before the cut: %s", name, len(index), index.cut)
        return index

    def _build_and_store(self, name: str, mtime_ns: int, candidates: list[str]) -> ShardIndex:
        path = self._local_shard(name)
        try:
            index = build_index(path, self.extensions, mtime_ns, keep_partial=True)
        finally:
            if path.endswith(".tmp"):  # the temporary copy of a bucket's shard
                os.unlink(path)
        for path in candidates:
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                save_index(index, path, self.extensions)
                return index
            except OSError:
                continue
        log.warning("coordl: no writable place for the index of %s: it is rebuilt on every start", name)
        return index

    def _local_shard(self, name: str) -> str:
        """A local path to the shard's bytes (staging it first when staged; a temporary copy from a bucket)."""
        if self._bucket is not None:  # through the buffer: one GET, staged whole if the budget has room
            os.makedirs(self.index_dir, exist_ok=True)
            tmp = os.path.join(self.index_dir, f".{name}.{os.getpid()}.tmp")
            with open(tmp, "wb") as f:
                f.write(self._buffer.get(name))
            return tmp
        if self._staged is None:
            return os.path.join(self.directory, name)
        if not self._staged.is_staged(name):
            self._staged.read(name)
        if not self._staged.is_staged(name):
            raise OSError(
                f"{self._where(name)}: cannot index an unstaged shard ({self._staged.staging_stopped})"
            )
        return self._staged.local_path(name)

    def _build_tables(self, indexes: list[ShardIndex]) -> None:
        counts = [len(ix) for ix in indexes]
        self._starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        self._shard_of = np.repeat(np.arange(len(indexes), dtype=np.int32), counts)
        self._offsets = np.concatenate([ix.offsets for ix in indexes]) if indexes else np.zeros(0, np.int64)
        self._sizes = np.concatenate([ix.sizes for ix in indexes]) if indexes else np.zeros(0, np.int64)
        self._labels = np.concatenate([ix.labels for ix in indexes]) if indexes else np.zeros(0, np.int64)
        self.keys = [k for ix in indexes for k in ix.keys]
        self._exts = [e for ix in indexes for e in ix.exts]
        missing = int((self._labels == NO_LABEL).sum())
        if missing:
            first = int(np.flatnonzero(self._labels == NO_LABEL)[0])
            log.warning(
                "coordl: %d samples of %s have no readable .cls label (first: %s); prep raises CorruptItemError "
                "for them (DataLoader(on_error='skip') drops them)", missing, self.pattern, self.describe(first),
            )  # fmt: skip
        if not len(self.keys):
            raise FileNotFoundError(
                f"TarShards({self.pattern!r}): no members with extensions {self.extensions}"
            )

    def _init_local_state(self) -> None:
        for fd in getattr(self, "_fds", {}).values():  # a forked child's copies of the parent's files
            os.close(fd)
        self._fds: dict[int, int] = {}
        self._fd_lock = threading.Lock()
        self._local_shards: set[int] = set()
        self._plan_front: dict[tuple[int, int], int] = {}  # (epoch, stream) -> furthest shard read ahead from
        self._fd_pid = os.getpid()  # last: a thread that sees this pid finds the fresh state above

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for name in ("_fds", "_fd_lock", "_local_shards", "_plan_front", "_fd_pid"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_local_state()

    # -- reads --------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def targets(self) -> list[int]:
        """Every sample's label (``NO_LABEL`` where the shard has none)."""
        return self._labels.tolist()

    def member_name(self, index: int) -> str:
        """The tar member holding sample ``index`` (``key.ext``)."""
        return f"{self.keys[index]}.{self._exts[index]}"

    def describe(self, index: int) -> str:
        """``<shard>:<member> @ offset N`` (used in error messages)."""
        shard = self.shards[int(self._shard_of[index])]
        return f"{self._where(shard)}:{self.member_name(index)} @ offset {int(self._offsets[index])}"

    def _shard_path(self, s: int) -> str:
        """Local path to read shard ``s`` from (staged copy, staging it on first use, or the source)."""
        name = self.shards[s]
        if self._staged is None:
            return os.path.join(self.directory, name)
        if s in self._local_shards:
            return self._staged.local_path(name)
        if not self._staged.is_staged(name):
            self._staged.read(name)  # stages the whole shard (unless the budget or the disk is full)
        if self._staged.is_staged(name):
            self._local_shards.add(s)
            return self._staged.local_path(name)
        local_root = getattr(self._staged.source, "root", None)
        if local_root is None:
            raise OSError(
                f"{self._where(name)}: staging stopped ({self._staged.staging_stopped}) and this source "
                "cannot read byte ranges: raise stage_budget_bytes or free space in stage_dir"
            )
        return os.path.join(local_root, name)  # a mounted directory: read the range there

    def _fd(self, s: int) -> tuple[int, bool]:
        """(descriptor, owned): owned descriptors stay open for later reads."""
        if self._fd_pid != os.getpid():  # a forked copy: the parent's descriptors share its file offsets
            with _fork_lock:  # once per child, though its fetch-ahead threads all arrive here first
                if self._fd_pid != os.getpid():
                    self._init_local_state()
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
            if len(self._fds) < self.max_open_shards:
                self._fds[s] = new
                return new, True
            return new, False

    def _read(self, index: int) -> bytes:
        if not 0 <= index < len(self.keys):
            raise IndexError(f"TarShards: index {index} out of range (0..{len(self.keys) - 1})")
        s = int(self._shard_of[index])
        offset, size = int(self._offsets[index]), int(self._sizes[index])
        foreign = self._plan is not None and self._read_ahead(s)
        if self._buffer is not None and not self._has_local(s):
            name = self.shards[s]
            if foreign and not self._buffer.holds(name):  # the epoch's tail: this sample only, one ranged GET
                data = self._bucket.read_range(name, offset, size)
            else:
                data = self._buffer.slice(name, offset, size)
            if len(data) == size:
                return data
            where = self.describe(index)
            raise CorruptItemError(f"{where}: read {len(data)} of {size} bytes (truncated shard)", path=where,
                                   index=index)  # fmt: skip
        fd, owned = self._fd(s)
        try:
            data = os.pread(fd, size, offset)
        finally:
            if not owned:
                os.close(fd)
        if len(data) != size:
            where = self.describe(index)
            raise CorruptItemError(
                f"{where}: read {len(data)} of {size} bytes (truncated shard)", path=where, index=index
            )
        return data

    def wants_shard_plan(self) -> bool:
        """True when whole shards are streamed from a bucket and fetched ahead (see :class:`coordl.ShardSampler`)."""
        return self._buffer is not None and self._buffer.ahead_bytes > 0

    def attach_shard_plan(self, plan: Any) -> None:
        """The sampler's :class:`~coordl.packed.shard_sampler.ShardPlan`: which shards each reader reads next."""
        self._plan = plan

    def _read_ahead(self, s: int) -> bool:
        """On reaching a shard further along this reader's stream, name the shards after it to the buffer.

        True when ``s`` is in another loader worker's stream: the sampler hands a worker whose shards ran out
        the last samples of another's, and fetching that shard whole would GET it twice in the epoch (8-16 MB
        of 90 measured); the caller reads those few samples by range instead (when no staged copy serves).
        """
        found = self._plan.locate(s)
        if found is None:
            return False
        epoch, stream, position = found
        if stream != _worker_stream(self._plan.n_streams, stream):
            return True
        if self._plan_front.get((epoch, stream), -1) >= position:
            return False  # samples of a window interleave: only a step forward renews the list
        self._plan_front[(epoch, stream)] = position
        # from this shard's window on: its shards may wait fetched ahead and unread, and must not be dropped
        self._buffer.want([self.shards[t] for t in self._plan.ahead_of(stream, position)])
        return False

    def local_shards(self) -> list[int]:
        """Shards read from a local staged copy (none when nothing is staged), for :class:`coordl.ShardSampler`."""
        if self._staged is None:
            return []
        return [s for s, name in enumerate(self.shards) if self._staged.is_staged(name)]

    def _has_local(self, s: int) -> bool:
        """True when shard ``s`` is (or can now be) read from a local staged copy."""
        if self._staged is None:
            return False
        if s in self._local_shards:
            return True
        if self._staged.is_staged(self.shards[s]):
            self._local_shards.add(s)
            return True
        return False  # the buffer's fetch (StagedSource.read) stages it whole if the budget has room

    def target(self, index: int) -> Any:
        label = int(self._labels[index])
        if label == NO_LABEL:
            where = self.describe(index)
            raise CorruptItemError(
                f"{where}: no readable .cls label for this sample", path=where, index=index
            )
        return self.target_transform(label) if self.target_transform is not None else label

    def storage_files(self) -> list[str]:
        """The files this source reads from (the shards; their staged copies when staged), e.g. to evict them."""
        if self._staged is None:
            return [os.path.join(self.directory, n) for n in self.shards]
        return [self._staged.local_path(n) for n in self.shards if self._staged.is_staged(n)]

    def stats(self) -> dict[str, int]:
        """Staging counters (``staged_items`` = shards, ``staged_bytes``, ``remote_bytes_read``) and a bucket's
        (``store_requests``, ``store_bytes``, ``store_retries``); empty for local shards."""
        out = dict(self._staged.stats()) if self._staged is not None else {}
        if self._bucket is not None:
            out.update(self._bucket.stats())
        return out

    def shard_ranges(self) -> list[tuple[int, int]]:
        """``[(first, end)]`` sample indexes of each shard, for :class:`coordl.ShardSampler`."""
        starts = self._starts.tolist()
        return list(zip(starts[:-1], starts[1:], strict=True))

    def dataset_identity(self) -> str:
        """Pattern plus each shard's size and sample count: a changed shard never hits a stale cache."""
        h = hashlib.sha256()
        for name, count in zip(self.shards, np.diff(self._starts).tolist(), strict=True):
            h.update(f"{name}\t{count}\n".encode())
        h.update(self._sizes.tobytes())
        h.update(self._labels.tobytes())
        return f"tarshards:{self.pattern}:{len(self.keys)}:{h.hexdigest()[:16]}"

    def close(self) -> None:
        """Close the shard files this process holds open and stop fetching shards ahead."""
        if self._buffer is not None:
            self._buffer.close()
        with self._fd_lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

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

Where the shards are and how their bytes are read (local, staged, bucket) is :mod:`coordl.packed.shardfiles`;
this module is the dataset over them: the samples' table, their labels and names.
"""

from __future__ import annotations

import hashlib
import logging
import os
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from coordl.datasets.files import IMG_EXTENSIONS, _FileSource
from coordl.errors import CorruptItemError
from coordl.packed.shardfiles import DEFAULT_MAX_OPEN_SHARDS, ShardFiles, ShardReads
from coordl.packed.shards import NO_LABEL, ShardIndex, TruncatedShardError, expand_braces
from shmem.strings import StringArray

__all__ = ["TarShards", "TruncatedShardError"]

log = logging.getLogger("coordl.tar")


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
        files = self._files = ShardFiles(
            self.pattern, self.directory, index_dir=os.fspath(index_dir) if index_dir is not None else None,
            stage_dir=stage_dir, stage_budget_bytes=stage_budget_bytes, prefetch=prefetch,
            max_open_shards=max_open_shards, storage_options=storage_options, memory_shards=memory_shards,
        )  # fmt: skip
        self.index_dir = files.index_dir
        remote = files.listing
        names = (
            sorted(n for n in remote if n.endswith(".tar"))
            if not name_pattern
            else expand_braces(name_pattern)
        )
        missing = [n for n in names if n not in remote]
        if missing or not names:
            raise FileNotFoundError(
                f"TarShards({self.pattern!r}): {len(missing)} of {len(names)} shards missing, e.g. "
                f"{files.where(missing[0]) if missing else self.directory + '/*.tar'}"
            )
        self.shards = names
        files.use(names, read_ahead_bytes)
        self._build_tables([self._check_cut(name, files.find_index(name, self.extensions)) for name in names])
        self._reads = ShardReads(files)

    def _check_cut(self, name: str, index: ShardIndex) -> ShardIndex:
        """A truncated shard raises, or with ``truncated="skip"`` keeps what precedes the cut (logged)."""
        if index.cut and self.truncated == "raise":
            raise TruncatedShardError(
                f"{index.cut} (TarShards(truncated='skip') keeps the samples before it)"
            )
        if index.cut:
            log.warning("coordl: %s: %d samples kept before the cut: %s", name, len(index), index.cut)
        return index

    def _build_tables(self, indexes: list[ShardIndex]) -> None:
        counts = [len(ix) for ix in indexes]
        self._starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        self._shard_of = np.repeat(np.arange(len(indexes), dtype=np.int32), counts)
        self._offsets = np.concatenate([ix.offsets for ix in indexes]) if indexes else np.zeros(0, np.int64)
        self._sizes = np.concatenate([ix.sizes for ix in indexes]) if indexes else np.zeros(0, np.int64)
        self._labels = np.concatenate([ix.labels for ix in indexes]) if indexes else np.zeros(0, np.int64)
        # Held flat (shmem.strings): no str per sample for every loader worker to inherit or unpickle.
        self.keys = StringArray.concat(ix.keys for ix in indexes)
        self._exts = StringArray.concat(ix.exts for ix in indexes)
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
        return f"{self._files.where(shard)}:{self.member_name(index)} @ offset {int(self._offsets[index])}"

    def _read(self, index: int) -> bytes:
        if not 0 <= index < len(self.keys):
            raise IndexError(f"TarShards: index {index} out of range (0..{len(self.keys) - 1})")
        size = int(self._sizes[index])
        data = self._reads.read(int(self._shard_of[index]), int(self._offsets[index]), size)
        if len(data) != size:
            where = self.describe(index)
            raise CorruptItemError(
                f"{where}: read {len(data)} of {size} bytes (truncated shard)", path=where, index=index
            )
        return data

    def wants_shard_plan(self) -> bool:
        """True when whole shards are streamed from a bucket and fetched ahead (see :class:`coordl.ShardSampler`)."""
        return self._reads.wants_plan()

    def attach_shard_plan(self, plan: Any) -> None:
        """The sampler's :class:`~coordl.packed.shard_sampler.ShardPlan`: which shards each reader reads next."""
        self._reads.attach_plan(plan)

    def local_shards(self) -> list[int]:
        """Shards read from a local staged copy (none when nothing is staged), for :class:`coordl.ShardSampler`."""
        return self._files.local_shards()

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
        return self._files.storage_files()

    def stats(self) -> dict[str, int]:
        """Staging counters (``staged_items`` = shards, ``staged_bytes``, ``remote_bytes_read``) and a bucket's
        (``store_requests``, ``store_bytes``, ``store_retries``); empty for local shards."""
        return self._files.stats()

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
        self._reads.close()

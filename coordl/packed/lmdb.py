"""``coordl.LMDBDataset``: samples stored as records of one LMDB environment (as ``coordl pack`` writes it).

One memory-mapped file instead of a tree of small files: a read is a B-tree lookup and a copy out of
the map, with no open/stat/close per sample. The format (version 1), never pickle:

* record ``i`` under the 8-byte big-endian key ``i`` (so keys sort in index order), its value a
  24-byte header then the encoded sample::

      magic b"CDLR" | version u8 | flags u8 (bit 0: has a label) | reserved u16 |
      label i64 | payload length u32 | payload CRC32 u32          (all little-endian)

* ``__coordl_meta__``: UTF-8 JSON ``{"format": "coordl-lmdb", "version": 1, "count": N,
  "complete": true, "classes": [...], "source": ...}``; ``complete`` is false while a pack runs.
* ``__coordl_labels__``: the N labels as little-endian int64 (``NO_LABEL`` where absent), so that
  ``prep_random`` (which gets a cached array, not the record) knows the label without a read.

``fetch(i)`` returns the whole record; ``prep`` checks its header (magic, length, CRC, label equal
to the table's) so a damaged record is a :class:`CorruptItemError` naming the key, never a wrong
label. The environment is opened read-only with ``lock=False`` once per process, lazily: a forked
worker notices the new pid and opens its own (an LMDB environment must not cross a fork).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zlib
from collections.abc import Callable
from typing import Any

import lmdb
import numpy as np

from coordl.datasets.files import _FileSource
from coordl.errors import CorruptItemError
from coordl.packed.lmdbenv import ProcessEnv, close_process_env, process_env
from coordl.packed.shards import NO_LABEL

__all__ = ["LMDBDataset", "pack_record", "unpack_record", "record_key", "META_KEY", "LABELS_KEY"]

FORMAT_VERSION = 1
META_KEY = b"__coordl_meta__"
LABELS_KEY = b"__coordl_labels__"
_HEADER = struct.Struct("<4sBBHqII")
_MAGIC = b"CDLR"
_HAS_LABEL = 1


def record_key(index: int) -> bytes:
    """The key of record ``index``."""
    return index.to_bytes(8, "big")


def pack_record(payload: bytes, label: int | None) -> bytes:
    """Header + payload, as stored (``label`` None: the record has no label)."""
    flags = _HAS_LABEL if label is not None else 0
    header = _HEADER.pack(
        _MAGIC, FORMAT_VERSION, flags, 0, label if label is not None else 0, len(payload), zlib.crc32(payload)
    )
    return header + payload


def unpack_record(record: bytes | memoryview, where: str = "record") -> tuple[memoryview, int | None, int]:
    """(payload, label or None, stored CRC32); raises CorruptItemError on a bad header or length."""
    if len(record) < _HEADER.size:
        raise CorruptItemError(f"{where}: record of {len(record)} bytes is shorter than its header")
    magic, version, flags, _, label, length, crc = _HEADER.unpack_from(record)
    if magic != _MAGIC or version != FORMAT_VERSION:
        raise CorruptItemError(f"{where}: not a coordl record (magic {magic!r}, version {version})")
    payload = memoryview(record)[_HEADER.size :]
    if len(payload) != length:
        raise CorruptItemError(f"{where}: payload is {len(payload)} bytes, its header says {length}")
    return payload, (label if flags & _HAS_LABEL else None), crc


def _stage_from_bucket(url: str, stage_dir: Any, storage_options: Any) -> tuple[str, Any]:
    """(local path of the staged data file, its StagedSource): an LMDB environment is memory-mapped at random
    offsets, so it must be a local file; from a bucket it is fetched whole once into ``stage_dir``."""
    if stage_dir is None:
        raise ValueError(
            f"LMDBDataset({url!r}): an LMDB environment is memory-mapped, so it is read from a local copy: pass "
            "stage_dir= (local disk, or /dev/shm for RAM) and it is fetched whole once"
        )
    from coordl.objectstore.source import S3Source
    from nfs_cache import StagedSource
    from shmem.counters import SharedCounters

    parent, _, name = url.rstrip("/").rpartition("/")
    source = S3Source(parent, storage_options)
    names = {f.relpath for f in source.list_files()}
    rel = f"{name}/data.mdb" if f"{name}/data.mdb" in names else name
    if rel not in names:
        raise FileNotFoundError(
            f"LMDBDataset: no {source.describe(name)} nor {source.describe(name + '/data.mdb')}"
        )
    staged = StagedSource(source, os.fspath(stage_dir), counters=SharedCounters(["remote_bytes_read"]))
    staged.read(rel)  # one GET of the whole file (checksummed, atomic); later runs find it staged
    if not staged.is_staged(rel):
        raise OSError(f"LMDBDataset: could not stage {source.describe(rel)} into {stage_dir} (disk full?)")
    return staged.local_path(rel), staged


def _data_file(path: str) -> tuple[str, bool]:
    """(the data.mdb file, subdir flag): ``path`` is the environment directory or the file itself."""
    if os.path.isdir(path):
        return os.path.join(path, "data.mdb"), True
    return path, False


class LMDBDataset(_FileSource):
    """Samples of a coordl LMDB environment (``coordl pack SRC DST --format lmdb``).

    Args:
        path: the environment directory (holding ``data.mdb``) or the data file itself; or its ``s3://`` URL,
            fetched whole into ``stage_dir`` once (``storage_options`` for the endpoint and credentials).
        transform: gets the encoded sample bytes (default: decode to an HWC uint8 array).
        target_transform: applied to the label.
        verify: check each record's CRC32 in prep (about 1 GB/s of CPU): catches a damaged page.
        readahead: let the kernel read ahead around each access. Off by default: samples are read
            in random order, and read-ahead fetches neighbouring pages never used; instead a record
            larger than half a page is read with one ``pread`` (see :mod:`coordl.packed.lmdbenv`), so
            it costs one storage request rather than one per 4 KiB page.
    """

    thread_safe_fetch = True  # one read-only transaction per fetch; the environment is thread-safe

    def __init__(
        self,
        path: str | os.PathLike,
        transform: Callable | None = None,
        target_transform: Callable | None = None,
        *,
        verify: bool = True,
        readahead: bool = False,
        stage_dir: str | os.PathLike | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(transform, target_transform)
        self.path = os.fspath(path)
        self.url, self._staged = None, None
        if self.path.lower().startswith(("s3://", "s3a://")):
            self.url = self.path
            self.path, self._staged = _stage_from_bucket(self.url, stage_dir, storage_options)
        self.verify = verify
        self.readahead = readahead
        self._data_path, self._subdir = _data_file(self.path)
        self._data_path = os.path.realpath(self._data_path)  # one environment per file, however named
        if not os.path.isfile(self._data_path):
            raise FileNotFoundError(f"LMDBDataset: no LMDB data file at {self._data_path}")
        env = self._env_here()
        self._check_size(env)
        meta, labels, entries = self._read_meta(env)
        self.classes: list[str] = list(meta.get("classes") or [])
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self._labels = labels
        self._n = int(meta["count"])
        if entries - 2 != self._n or len(labels) != self._n:
            raise ValueError(
                f"LMDBDataset({self.path}): {entries - 2} records and {len(labels)} labels, metadata says "
                f"{self._n}: the environment is damaged (repack it with coordl pack)"
            )

    # -- opening ------------------------------------------------------------------------------------

    def _env_here(self) -> Any:
        """This process's environment for the data file (see :mod:`coordl.packed.lmdbenv`)."""
        return self._process_env().env

    def _process_env(self) -> ProcessEnv:
        try:
            return process_env(self._data_path, self._subdir, self.readahead)
        except lmdb.Error as e:
            raise ValueError(f"LMDBDataset: {self._data_path} is not a readable LMDB environment: {e}") from e

    def _check_size(self, env: Any) -> None:
        # A truncated data file would be found by a SIGBUS in whichever worker touches the missing page.
        needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        size = os.path.getsize(self._data_path)
        if size < needed:
            raise ValueError(
                f"LMDBDataset: {self._data_path} is truncated: {size} bytes, its last page ends at {needed}"
            )

    def _read_meta(self, env: Any) -> tuple[dict, np.ndarray, int]:
        try:
            with env.begin() as txn:
                raw_meta = txn.get(META_KEY)
                raw_labels = txn.get(LABELS_KEY)
                entries = txn.stat()["entries"]
        except lmdb.Error as e:
            raise ValueError(f"LMDBDataset: {self._data_path}: damaged environment: {e}") from e
        if raw_meta is None:
            raise ValueError(
                f"LMDBDataset: {self.path} has no {META_KEY.decode()} record: not written by coordl pack "
                "(convert it: coordl pack SRC DST --format lmdb)"
            )
        try:
            meta = json.loads(raw_meta)
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"LMDBDataset: {self.path}: unreadable metadata: {e}") from e
        if meta.get("format") != "coordl-lmdb" or meta.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"LMDBDataset: {self.path}: unknown format {meta.get('format')} v{meta.get('version')}"
            )
        if not meta.get("complete") or raw_labels is None:
            raise ValueError(
                f"LMDBDataset: {self.path}: the pack did not finish (run coordl pack again to resume)"
            )
        return meta, np.frombuffer(raw_labels, dtype="<i8").astype(np.int64), int(entries)

    # -- reads --------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._n

    @property
    def targets(self) -> list[int]:
        """Every record's label (``NO_LABEL`` where the record has none)."""
        return self._labels.tolist()

    def describe(self, index: int) -> str:
        """``<path>:key <index>`` (used in error messages)."""
        return f"{self.path}:key {index} ({record_key(index).hex()})"

    def _read(self, index: int) -> bytes:
        if not 0 <= index < self._n:
            raise IndexError(f"LMDBDataset: index {index} out of range (0..{self._n - 1})")
        penv = self._process_env()
        try:
            with penv.env.begin(buffers=True) as txn:
                view = txn.get(record_key(index))
                record = penv.copy_value(view) if view is not None else None
        except lmdb.Error as e:
            where = self.describe(index)
            raise CorruptItemError(f"{where}: LMDB read failed: {e}", path=where, index=index) from e
        if record is None:
            where = self.describe(index)
            raise CorruptItemError(f"{where}: record missing", path=where, index=index)
        return record

    def payload(self, raw: bytes, index: int) -> bytes:
        """The encoded sample inside record ``raw``, after checking its header (and CRC with ``verify``)."""
        where = self.describe(index)
        try:
            data, label, crc = unpack_record(raw, where)
        except CorruptItemError as e:
            raise CorruptItemError(str(e), path=where, index=index) from None
        if self.verify and zlib.crc32(data) != crc:
            raise CorruptItemError(
                f"{where}: payload CRC32 mismatch (damaged record)", path=where, index=index
            )
        expected = int(self._labels[index])
        if (label is None) != (expected == NO_LABEL) or (label is not None and label != expected):
            raise CorruptItemError(
                f"{where}: record label {label} differs from the label table's {expected}",
                path=where,
                index=index,
            )
        return bytes(data)

    def prep(self, raw: bytes, index: int) -> Any:
        """``(transform(payload), label)``; a damaged record raises CorruptItemError naming its key."""
        return super().prep(self.payload(raw, index), index)

    def _prep_deterministic(self, raw: bytes, index: int) -> np.ndarray:
        return super()._prep_deterministic(self.payload(raw, index), index)

    def target(self, index: int) -> Any:
        label = int(self._labels[index])
        if label == NO_LABEL:
            where = self.describe(index)
            raise CorruptItemError(f"{where}: the record has no label", path=where, index=index)
        return self.target_transform(label) if self.target_transform is not None else label

    def dataset_identity(self) -> str:
        """Path, count, data file size/mtime and label digest: a repacked environment never hits a stale cache."""
        st = os.stat(self._data_path)
        h = hashlib.sha256(self._labels.tobytes())
        h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
        digest = h.hexdigest()[:16]
        return f"lmdb:{os.path.abspath(self.path)}:{self._n}:{digest}"

    def storage_files(self) -> list[str]:
        """The files this source reads from (the data file), e.g. to evict them from the page cache."""
        return [self._data_path]

    def stats(self) -> dict[str, int]:
        """Staging and object-store counters when read from a bucket; otherwise none (the loader counts)."""
        if self._staged is None:
            return {}
        return {**self._staged.stats(), **self._staged.source.stats()}

    def close(self) -> None:
        """Close this process's environment for the file (any dataset on it reopens it on its next read)."""
        close_process_env(self._data_path)

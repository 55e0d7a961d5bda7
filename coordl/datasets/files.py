"""Datasets of image files that implement the fetch/prep split.

- :class:`ImageFolder`: the standard ``root/class/xxx.jpg`` layout, local, streamed from a bucket
  (``s3://`` root, :mod:`coordl.objectstore`), or staged from a remote source (``nfs://`` URL or
  ``stage_dir=``) through ``nfs_cache.StagedSource``.
- :class:`FileListDataset`: the same over an explicit list of files (paths or ``s3://`` URLs).

Datasets that do not implement the split are adapted by :mod:`coordl.datasets.adapt`.

``prep`` returns ``(sample, target)`` like torchvision; ``fetch`` returns the file's bytes and counts
nothing (the loader counts bytes and hits). When the transform is a :class:`coordl.transforms.Compose`
with a deterministic prefix (decode, resize), the dataset also exposes ``prep_deterministic``,
``prep_random``, ``prep_identity`` and ``dataset_identity`` so that prefix can be cached as an array.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from coordl.datasets.filelist import FileList, IndexedView, ItemView
from coordl.errors import CorruptItemError
from coordl.fileread.read import read_file
from coordl.prep.transforms import Compose, Decode

__all__ = ["ImageFolder", "FileListDataset", "IMG_EXTENSIONS"]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def _reads_its_own_way(source: Any, cls: type) -> bool:
    """Whether ``source``'s class overrides how ``cls`` reads an item (then only its fetch knows how)."""
    return any(
        getattr(type(source), name) is not getattr(cls, name) for name in ("fetch", "fetch_uncached", "_read")
    )


class _FileSource:
    """Shared fetch/prep logic over a list of (relative name, target) items."""

    def __init__(self, transform: Callable | None, target_transform: Callable | None) -> None:
        self.transform = transform if transform is not None else Compose([Decode()])
        self.target_transform = target_transform
        self._det: Compose | None = None
        self._rand: Compose | None = None
        if isinstance(self.transform, Compose):
            det, rand = self.transform.split()
            if len(det):
                self._det, self._rand = det, rand

    # fetch() opens, reads and closes a file (or a staged copy, under nfs_cache's flock locks): safe
    # to call from several threads, so coordl.DataLoader reads ahead of prep by default.
    thread_safe_fetch = True

    @property
    def prep_reads_buffers(self) -> bool:
        """Whether :meth:`prep` may be given a read-only view of the bytes (a cache row) instead of
        ``bytes``: when the transform says it reads buffers (coordl's ``Decode`` first)."""
        return getattr(self.transform, "reads_buffers", False) is True

    # The file list, flat (coordl.datasets.filelist): set by the subclasses that list files.
    _file_list: FileList

    @property
    def items(self) -> ItemView:
        """``[(name, target)]`` as a read-only list view (the dataset holds flat arrays, not the pairs)."""
        return self._file_list.view()

    @items.setter
    def items(self, pairs: Sequence[tuple[str, Any]]) -> None:
        """Replace the file list (e.g. keep a subset: ``ds.items = ds.items[:1000]``)."""
        self._file_list = FileList.from_pairs(pairs)

    @property
    def targets(self) -> Sequence[Any]:
        """Every item's target (class index; None in a FileListDataset without ``targets=``), a read-only list
        view (``np.asarray(ds.targets)`` copies one array)."""
        return self._file_list.targets

    def _read(self, index: int) -> bytes:
        raise NotImplementedError

    def describe(self, index: int) -> str:
        """The item's file path (used in error messages)."""
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._file_list)

    def fetch(self, index: int) -> bytes:
        """The stored bytes of item ``index`` (no decoding, nothing counted)."""
        return self._read(index)

    def target(self, index: int) -> Any:
        """Item ``index``'s label after ``target_transform``, without reading or decoding the file."""
        target = self._file_list.target(index)
        return self.target_transform(target) if self.target_transform is not None else target

    def _wrap_corrupt(self, e: CorruptItemError, index: int) -> CorruptItemError:
        path = self.describe(index)
        return CorruptItemError(f"{path}: {e}", path=path, index=index)

    def prep(self, raw: bytes, index: int) -> Any:
        """``(transform(raw), target)``; undecodable bytes raise CorruptItemError naming the file."""
        try:
            sample = self.transform(raw)
        except CorruptItemError as e:
            raise self._wrap_corrupt(e, index) from e
        return sample, self.target(index)

    def __getitem__(self, index: int) -> Any:
        """Plain map-style access (fetch + prep), so the dataset also works with torch's DataLoader."""
        return self.prep(self.fetch(index), index)

    # The split is exposed only when the transform has one: has_split_prep() must say False
    # otherwise, so these are properties that raise AttributeError (getattr(..., None) -> None).
    def _need_split(self, name: str) -> None:
        if self._det is None:
            raise AttributeError(f"{name}: transform {self.transform!r} has no deterministic prefix to cache")

    @property
    def prep_deterministic(self) -> Callable[[bytes, int], np.ndarray]:
        """``(raw, i) -> array``: the cacheable part of prep (decode, resize)."""
        self._need_split("prep_deterministic")
        return self._prep_deterministic

    @property
    def prep_random(self) -> Callable[[np.ndarray, int], Any]:
        """``(array, i) -> (sample, target)``: the part of prep that must run every epoch."""
        self._need_split("prep_random")
        return self._prep_random

    @property
    def prep_identity(self) -> Callable[[], str]:
        """``() -> str``: the repr of the deterministic prefix (every parameter included)."""
        self._need_split("prep_identity")
        return self._prep_identity

    def _prep_deterministic(self, raw: bytes, index: int) -> np.ndarray:
        assert self._det is not None  # handed out only by prep_deterministic, which refuses without a split
        try:
            return np.ascontiguousarray(self._det(raw))
        except CorruptItemError as e:
            raise self._wrap_corrupt(e, index) from e

    def _prep_random(self, array: np.ndarray, index: int) -> Any:
        assert self._rand is not None  # handed out only by prep_random, which refuses without a split
        return self._rand(array), self.target(index)

    def _prep_identity(self) -> str:
        return repr(self._det)

    def _list_digest(self) -> str:
        return self._file_list.digest()


class FileListDataset(_FileSource):
    """Items are explicit files; ``targets[i]`` is item i's label (None: prep returns the sample only).

    ``transform`` gets the raw bytes (default: decode to an HWC uint8 array).
    """

    def __init__(
        self,
        paths: Sequence[str | os.PathLike],
        targets: Sequence[Any] | None = None,
        transform: Callable | None = None,
        target_transform: Callable | None = None,
        *,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(transform, target_transform)
        if targets is not None and len(targets) != len(paths):
            raise ValueError(f"FileListDataset: {len(paths)} paths but {len(targets)} targets")
        self._file_list = FileList((os.fsdecode(p) for p in paths), targets)  # a bytes path: its str
        # s3:// entries are read through coordl.objectstore (one GET each); other entries are local files.
        self._urls = _url_reader(storage_options) if any(_is_s3(p) for p in self.paths) else None
        if self._urls is None and storage_options is not None:
            raise ValueError("FileListDataset: storage_options= is for s3:// paths, and no path is one")
        self.has_targets = targets is not None

    @property
    def paths(self) -> Sequence[str]:
        """Every item's path or URL (a read-only list of ``str``, held flat)."""
        return self._file_list.names

    def _read(self, index: int, cached: bool = True) -> bytes:
        path = self._file_list.name(index)
        if self._urls is not None and _is_s3(path):
            return self._urls.read(path)
        return read_file(path, cached=cached)

    def fetch_uncached(self, index: int) -> bytes:
        """As :meth:`fetch`, past the OS page cache where the file system allows (``O_DIRECT``): how a
        loader reads the items its MinIO cache does not keep (:mod:`coordl.fetch.pagecache`)."""
        return self._read(index, cached=False)

    def local_file(self, index: int) -> str | None:
        """The local file :meth:`fetch` reads whole for ``index``, or None (an s3:// path, or a subclass
        reading its own way): a loader's read-ahead reads it (:class:`coordl.fileread.read.ReadAhead`)."""
        path = self._file_list.name(index)
        if (self._urls is not None and _is_s3(path)) or _reads_its_own_way(self, FileListDataset):
            return None
        return path

    def describe(self, index: int) -> str:
        return self._file_list.name(index)

    def stats(self) -> dict[str, int]:
        """Object-store counters (``store_requests``, ``store_bytes``, ``store_retries``) for s3:// paths."""
        return self._urls.stats() if self._urls is not None else {}

    def prep(self, raw: bytes, index: int) -> Any:
        sample, target = super().prep(raw, index)
        return (sample, target) if self.has_targets else sample

    def _prep_random(self, array: np.ndarray, index: int) -> Any:
        assert self._rand is not None  # handed out only by prep_random, which refuses without a split
        sample, target = super()._prep_random(array, index)
        return (sample, target) if self.has_targets else sample

    def dataset_identity(self) -> str:
        """Digest of the file list (paths and targets)."""
        return f"filelist:{self._list_digest()}"


def _is_url(root: str) -> bool:
    return "://" in root


def _is_s3(path: str) -> bool:
    return path.lower().startswith(("s3://", "s3a://"))


def _url_reader(storage_options: dict[str, Any] | None) -> Any:
    from coordl.objectstore import UrlReader  # lazy: only bucket datasets need boto3

    return UrlReader(storage_options)


def _bucket_source(root: str, storage_options: dict[str, Any] | None, refresh_listing: bool) -> Any:
    from coordl.objectstore import S3Source  # lazy: only bucket datasets need boto3

    return S3Source(root, storage_options, refresh_listing=refresh_listing)


def _visible(relpath: str) -> bool:
    """False for a path with a hidden part (``.coordl/`` bookkeeping, ``.ipynb_checkpoints/``, ``._x.jpg``)."""
    return not any(part.startswith(".") for part in relpath.split("/"))


class ImageFolder(_FileSource):
    """``root/<class>/<...>/<file>`` images; classes are the sorted sub-directory names.

    Hidden folders and files (name starting with ``.``) are skipped, as ``ls`` does. A stage directory written by
    ``coordl stage SRC DST`` mirrors SRC and loads as SRC would once staging is complete; a partial one (or one in
    the old ``files/`` layout) raises ``nfs_cache.layout.StageDirError`` saying what to use instead, rather than
    giving wrong labels.

    ``transform`` gets the raw bytes (default: decode to an HWC uint8 array; use
    ``coordl.transforms.train_transform()``). An ``s3://bucket/prefix`` root without ``stage_dir`` is
    streamed: listed once (the listing is cached on disk, see :mod:`coordl.objectstore.listing`), each item
    one GET, no local copy; ``storage_options=`` gives the endpoint and credentials (default: environment and
    AWS config files), ``refresh_listing=True`` lists again. When ``root`` is an ``nfs://`` URL or ``stage_dir`` is
    given, files are listed and read through ``nfs_cache.StagedSource`` (first read stages each file
    onto local disk within ``stage_budget_bytes``; ``prefetch=True`` stages ahead in the background),
    and :meth:`stats` reports the staging counters.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        transform: Callable | None = None,
        target_transform: Callable | None = None,
        *,
        extensions: Sequence[str] = IMG_EXTENSIONS,
        stage_dir: str | os.PathLike | None = None,
        stage_budget_bytes: int | None = None,
        prefetch: bool = False,
        storage_options: dict[str, Any] | None = None,
        refresh_listing: bool = False,
    ) -> None:
        super().__init__(transform, target_transform)
        self.root = os.fspath(root)
        self.extensions = tuple(e.lower() for e in extensions)
        self._staged = None
        self._bucket = None
        if storage_options is not None and not _is_s3(self.root):
            raise ValueError(f"ImageFolder({self.root!r}): storage_options= is for s3:// roots")
        if _is_s3(self.root):
            self._bucket = _bucket_source(self.root, storage_options, refresh_listing)
        if self._bucket is not None and stage_dir is None:
            relpaths = [f.relpath for f in self._bucket.list_files()]
        elif stage_dir is not None or _is_url(self.root):
            from nfs_cache import StagedSource  # lazy: only staged datasets need it

            if stage_dir is None:
                raise ValueError(
                    f"ImageFolder({self.root!r}): a URL root needs stage_dir= (a local directory)"
                )
            from shmem.counters import SharedCounters

            # Workers read remote bytes too: count them where the loader's stats() can sum them.
            self._staged = StagedSource(
                self._bucket if self._bucket is not None else self.root,
                os.fspath(stage_dir),
                budget_bytes=stage_budget_bytes,
                prefetch=prefetch,
                counters=SharedCounters(["remote_bytes_read"]),
            )
            # The agreed interface lists relative paths; accept records with .relpath too.
            relpaths = [f if isinstance(f, str) else f.relpath for f in self._staged.list_files()]
        else:
            relpaths = self._scan_local()
        relpaths = [p for p in relpaths if self._keep(p)]
        if not relpaths:
            raise FileNotFoundError(
                f"ImageFolder: no files with extensions {self.extensions} under {self.root}/<class>/"
            )
        self.classes = sorted({p.split("/", 1)[0] for p in relpaths})
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        relpaths.sort()
        labels = [self.class_to_idx[p.split("/", 1)[0]] for p in relpaths]
        self._file_list = FileList(relpaths, labels)

    def _keep(self, relpath: str) -> bool:
        """An item: inside a class folder, with an image extension, nothing hidden on its path."""
        return "/" in relpath and relpath.lower().endswith(self.extensions) and _visible(relpath)

    def _scan_local(self) -> list[str]:
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"ImageFolder: {self.root} is not a directory")
        from nfs_cache.layout import check_plain_dataset  # a stage directory must be complete to read as one

        check_plain_dataset(self.root, self._keep, f"ImageFolder({self.root!r})")
        out: list[str] = []
        for entry in sorted(os.scandir(self.root), key=lambda e: e.name):
            if not entry.is_dir() or entry.name.startswith("."):
                continue  # hidden folders (.coordl/ of a stage directory, .ipynb_checkpoints) are no class
            for dirpath, dirs, files in os.walk(entry.path, followlinks=True):
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                rel = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
                out.extend(f"{rel}/{name}" for name in files)
        return out

    @property
    def samples(self) -> IndexedView:
        """[(path, class_index)] as in torchvision (URL-joined for a staged source), a read-only list view."""
        return IndexedView(len(self._file_list), self._sample)

    imgs = samples  # torchvision's older name

    def _sample(self, index: int) -> tuple[str, int]:
        return self.describe(index), self._file_list.target(index)

    def _read(self, index: int, cached: bool = True) -> bytes:
        rel = self._file_list.name(index)
        if self._staged is not None:
            return self._staged.read(rel)
        if self._bucket is not None:
            return self._bucket.read(rel)
        return read_file(os.path.join(self.root, rel), cached=cached)

    def fetch_uncached(self, index: int) -> bytes:
        """As :meth:`fetch`, past the OS page cache where the file system allows (``O_DIRECT``): how a
        loader reads the items its MinIO cache does not keep (:mod:`coordl.fetch.pagecache`). A staged
        or bucket root reads as :meth:`fetch` does."""
        return self._read(index, cached=False)

    def local_file(self, index: int) -> str | None:
        """The local file :meth:`fetch` reads whole for ``index``, or None (a staged or bucket root, or a
        subclass reading its own way): a loader's read-ahead reads it (:class:`coordl.fileread.read.ReadAhead`)."""
        if self._staged is not None or self._bucket is not None or _reads_its_own_way(self, ImageFolder):
            return None
        return os.path.join(self.root, self._file_list.name(index))

    def describe(self, index: int) -> str:
        rel = self._file_list.name(index)
        if self._staged is not None:
            return str(self._staged.describe(rel))
        if self._bucket is not None:
            return self._bucket.describe(rel)
        return os.path.join(self.root, rel)

    def stats(self) -> dict[str, int]:
        """Staging counters (staged_items, staged_bytes, remote_bytes_read) and, for a bucket, the store's
        (store_requests, store_bytes, store_retries); empty for local roots."""
        out = dict(self._staged.stats()) if self._staged is not None else {}
        if self._bucket is not None:
            out.update(self._bucket.stats())
        return out

    def dataset_identity(self) -> str:
        """Root plus a digest of the file list (and of the objects' sizes and ETags for a bucket): a changed
        file list never hits a stale cache."""
        listing = f":{self._bucket.digest()}" if self._bucket is not None else ""
        return f"imagefolder:{self.root}:{self._list_digest()}{listing}"

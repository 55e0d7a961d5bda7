"""``StagedSource``: read a remote dataset through a local stage directory (read-through staging).

The first read of a file copies it to local disk: into ``.coordl/tmp/``, then an atomic rename to ``<relpath>``
(the stage directory mirrors the source), then a manifest record with its size and CRC32. Later reads are local and
verified against that record; a file that fails verification is thrown away and copied again. Several processes
(DataLoader workers, other jobs on the node) may share one stage directory: striped ``flock`` locks make each file be
copied once, and the manifest is an append-only log they all read. When the disk budget (or the disk) is full,
staging stops and reads go to the remote source. The layout is described in ``layout.py``.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import shutil
import threading
import urllib.parse
import zlib
from typing import Any

from nfs_cache.layout import META_DIR, StageDirError, StageLayout, old_layout_message
from nfs_cache.locks import StripedLocks
from nfs_cache.manifest import Entry, Manifest
from nfs_cache.sources import RemoteFile, Source, _check_relpath, open_source

__all__ = ["StagedSource", "source_identity"]

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_tmp_counter = itertools.count()


def source_identity(source: Source) -> str:
    """The source's address without URL options (an ``nfsport`` may change between runs, the data does not)."""
    return (
        urllib.parse.urlsplit(source.url)._replace(query="").geturl() if "://" in source.url else source.url
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class StagedSource:
    """A remote dataset (directory, ``nfs://`` or fsspec URL) staged read-through into ``stage_dir``.

    Args:
        src: mounted directory, ``nfs://server/export/path[?version=4&nfsport=N]``, fsspec URL, or a ``Source``.
        stage_dir: local directory that holds the staged copies; reused across runs (resume after a crash).
        budget_bytes: stop staging once this many bytes are staged (reads of the rest stay remote). None: no cap.
        prefetch: stage every file in a background process while training reads (see ``prefetch.py``).
        counters: optional object with ``.add(name, amount)`` (coordl's SharedCounters); ``remote_bytes_read`` is
            added there so that DataLoader workers' reads are counted globally.
        verify: check each local read against the CRC32 recorded when it was staged (about 1 GB/s of CPU).
        min_free_bytes: leave this much free space on the stage disk for everything else (None: fill it up,
            staging stops at the first ENOSPC).
        lock_timeout_s: longest wait for another process that is copying the same file.
    """

    def __init__(
        self,
        src: str | os.PathLike | Source,
        stage_dir: str | os.PathLike,
        *,
        budget_bytes: int | None = None,
        prefetch: bool = False,
        counters: Any = None,
        verify: bool = True,
        min_free_bytes: int | None = 64 << 20,
        lock_timeout_s: float = 600.0,
    ) -> None:
        self.source = open_source(src)
        self.stage_dir = os.path.abspath(os.fspath(stage_dir))
        self.budget_bytes = budget_bytes
        self.counters = counters
        self.verify = verify
        self.min_free_bytes = min_free_bytes
        self.lock_timeout_s = lock_timeout_s
        self._prefetch_requested = prefetch
        self._check_stage_dir()
        self._open_local_state()
        self._claim_stage_dir()
        self._remove_dead_tmp()
        self._prefetcher: Any = None
        if prefetch:
            self.start_prefetch()

    # -- pickling: configuration only (DataLoader workers re-open everything lazily) --------------------------------

    def __getstate__(self) -> dict:
        keep = (
            "source",
            "stage_dir",
            "budget_bytes",
            "counters",
            "verify",
            "min_free_bytes",
            "lock_timeout_s",
        )
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._prefetch_requested = False
        self._prefetcher = None
        self._open_local_state()

    def _check_stage_dir(self) -> None:
        """Refuse a directory this class would damage or misread (before anything is written to it)."""
        layout = StageLayout(self.stage_dir)
        if layout.is_old_layout():
            raise StageDirError(old_layout_message(self.stage_dir))
        root = getattr(self.source, "root", None)
        if root is not None:  # a mounted directory: the copies must not land inside the source (or be it)
            src, dst = os.path.realpath(root), os.path.realpath(self.stage_dir)
            if os.path.commonpath([src, dst]) in (src, dst):
                raise StageDirError(
                    f"stage_dir {self.stage_dir!r} and the source {root!r} overlap: "
                    "stage into a directory outside the dataset"
                )
        if os.path.exists(self.stage_dir) and not os.path.isdir(self.stage_dir):
            raise StageDirError(f"stage_dir {self.stage_dir!r} is a file, not a directory")
        if layout.is_stage_dir() or not os.path.isdir(self.stage_dir):
            return
        # Staged copies mirror the source at the top of stage_dir: never mix them into someone's folder.
        foreign = sorted(n for n in os.listdir(self.stage_dir) if not n.startswith(".") and n != "lost+found")
        if foreign:
            raise StageDirError(
                f"stage_dir {self.stage_dir!r} is not empty ({', '.join(foreign[:3])}...) and is not a stage "
                f"directory (no {META_DIR}/): use a new or empty directory"
            )

    def _open_local_state(self) -> None:
        self.layout = StageLayout(self.stage_dir)
        self.tmp_dir = self.layout.tmp
        os.makedirs(self.tmp_dir, exist_ok=True)
        self.manifest = Manifest(self.layout.manifest)
        self.manifest.refresh()
        self.locks = StripedLocks(self.layout.locks)
        # One node-wide lock around "is there room? then record it": without it two processes staging
        # different files both saw room for one and the budget was overshot (seen: 92.7 MB staged in 89.7 MB).
        self.budget_lock = StripedLocks(os.path.join(self.layout.locks, "budget"), stripes=1)
        self._listing: dict[str, RemoteFile] = {}
        self._listed = False
        self._stats_lock = threading.Lock()
        self._local = {"remote_bytes_read": 0, "corrupt_staged": 0, "staged_here": 0, "unstaged_reads": 0}
        self.staging_stopped = ""  # why this process stopped staging ("" while it stages)

    def _claim_stage_dir(self) -> None:
        path = self.layout.source_file
        ident = source_identity(self.source)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            with open(path, encoding="utf-8") as f:
                owner = f.read().strip()
            if owner and owner != ident:
                raise ValueError(
                    f"stage_dir {self.stage_dir!r} holds a staged copy of {owner!r}, not of {ident!r}: "
                    "use another stage_dir (or delete this one)"
                ) from None
            return
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(ident + "\n")

    def _remove_dead_tmp(self) -> None:
        # Copies in progress of processes that died (kill -9, OOM) would otherwise fill the disk over restarts.
        for name in os.listdir(self.tmp_dir):
            try:
                pid = int(name.split(".", 1)[0])
            except ValueError:
                continue
            if pid != os.getpid() and not _pid_alive(pid):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.tmp_dir, name))

    # -- public API ------------------------------------------------------------------------------------------------

    def remote_files(self) -> list[RemoteFile]:
        """The remote files (sorted by path), listed once per instance: listing a large NFS tree is slow.

        Listing also forgets staged copies whose remote file changed size or mtime since they were staged, and
        records the list in the stage directory (so that a partial stage can be told from a complete one). A
        ``.coordl/`` folder at the source's top is another stage directory's bookkeeping and is left out.
        """
        if not self._listed:
            self._listing.update(
                (f.relpath, f) for f in self.source.list_files() if f.relpath.split("/", 1)[0] != META_DIR
            )
            self._listed = True
            self._forget_changed()
            self.layout.write_listing(sorted(self._listing), f"{os.getpid()}.{threading.get_ident()}.listing")
        return sorted(self._listing.values(), key=lambda f: f.relpath)

    def _forget_changed(self) -> None:
        self.manifest.refresh()
        for rel, entry in list(self.manifest.entries.items()):
            remote = self._listing.get(rel)
            # mtime 0: staged by a process that had no listing (a DataLoader worker); the size still counts.
            changed = entry.mtime_ns != 0 and remote is not None and remote.mtime_ns != entry.mtime_ns
            if remote is not None and (remote.size != entry.size or changed):
                self.manifest.remove(rel)
                # The stage directory is a dataset too: a stale copy must not stay readable there.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.local_path(rel))

    def list_files(self, extensions: list[str] | tuple[str, ...] | None = None) -> list[str]:
        """Sorted relative paths of the remote files (optionally only those ending in one of ``extensions``).

        See :meth:`remote_files` for what listing does besides.
        """
        files = self.remote_files()
        if extensions is None:
            return [f.relpath for f in files]
        exts = tuple(e.lower() if e.startswith(".") else "." + e.lower() for e in extensions)
        return [f.relpath for f in files if f.relpath.lower().endswith(exts)]

    def add_listing(self, files: list[RemoteFile]) -> None:
        """Tell this instance the remote size and mtime of ``files`` (checked and recorded when they are staged)."""
        self._listing.update((f.relpath, f) for f in files)

    def read(self, relpath: str) -> bytes:
        """The bytes of ``relpath``: from the stage directory if staged and verified, else copied there first."""
        if _check_relpath(relpath).split("/", 1)[0] == META_DIR:
            raise ValueError(
                f"invalid dataset path {relpath!r}: {META_DIR}/ holds the stage directory's bookkeeping"
            )
        entry = self.manifest.get(relpath)
        if entry is None:
            self.manifest.refresh()
            entry = self.manifest.get(relpath)
        if entry is not None:
            data = self._read_local(relpath, entry)
            if data is not None:
                return data
        return self._stage(relpath, bad=entry)

    def is_staged(self, relpath: str) -> bool:
        self.manifest.refresh()
        return relpath in self.manifest.entries

    def local_path(self, relpath: str) -> str:
        """Where the staged copy of ``relpath`` lives (it may not exist yet)."""
        return self.layout.local_path(relpath)

    def describe(self, relpath: str) -> str:
        return self.source.describe(relpath)

    def stats(self) -> dict[str, int]:
        """``staged_items``/``staged_bytes`` (whole node, from the manifest) and ``remote_bytes_read`` (all
        processes when ``counters`` was given, else this process)."""
        self.manifest.refresh()
        remote = self.local_stats()["remote_bytes_read"]
        snapshot = getattr(self.counters, "snapshot", None)
        if snapshot is not None:
            remote = int(snapshot().get("remote_bytes_read", remote))
        return {
            "staged_items": len(self.manifest.entries),
            "staged_bytes": self.manifest.total_bytes,
            "remote_bytes_read": remote,
        }

    def local_stats(self) -> dict[str, int]:
        """This process's counts: ``remote_bytes_read``, ``staged_here`` (copies it made), ``corrupt_staged``
        (copies that failed verification and were replaced), ``unstaged_reads`` (remote reads not staged)."""
        with self._stats_lock:
            return dict(self._local)

    def start_prefetch(self, workers: int = 1) -> None:
        """Stage every remaining file in a background process (stopped by ``close``)."""
        from nfs_cache.prefetch import BackgroundPrefetch

        if self._prefetcher is None:
            self.list_files()
            self._prefetcher = BackgroundPrefetch(self, list(self._listing.values()), workers=workers)

    def wait_prefetch(self, timeout_s: float) -> bool:
        """Wait for the background prefetch to finish; True when it did."""
        return self._prefetcher is None or self._prefetcher.wait(timeout_s)

    def close(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.stop()
            self._prefetcher = None
        self.manifest.close()
        self.source.close()

    def __enter__(self) -> StagedSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------------------------------

    def _count(self, name: str, amount: int = 1) -> None:
        with self._stats_lock:
            self._local[name] += amount
        if name == "remote_bytes_read" and self.counters is not None:
            self.counters.add("remote_bytes_read", amount)

    def _read_local(self, relpath: str, entry: Entry) -> bytes | None:
        """The staged bytes, or None when the copy is missing or fails verification."""
        try:
            with open(self.local_path(relpath), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        if len(data) != entry.size or (self.verify and zlib.crc32(data) != entry.crc32):
            return None
        return data

    def _read_remote(self, relpath: str) -> bytes:
        data = self.source.read(relpath)
        self._count("remote_bytes_read", len(data))
        known = self._listing.get(relpath)
        if known is not None and known.size != len(data):
            raise OSError(
                errno.EIO, f"{self.describe(relpath)}: read {len(data)} bytes, listing says {known.size}"
            )
        return data

    def _room_for(self, size: int) -> bool:
        if self.staging_stopped:
            return False
        if self.budget_bytes is not None and self.manifest.total_bytes + size > self.budget_bytes:
            self.staging_stopped = f"budget of {self.budget_bytes} bytes reached"
            return False
        if self.min_free_bytes is None:
            return True
        if shutil.disk_usage(self.stage_dir).free - size < self.min_free_bytes:
            self.staging_stopped = f"less than {self.min_free_bytes} bytes free in {self.stage_dir}"
            return False
        return True

    def _stage(self, relpath: str, bad: Entry | None) -> bytes:
        if not self._room_for(self._listing[relpath].size if relpath in self._listing else 0):
            self._count("unstaged_reads")
            return self._read_remote(relpath)
        with self.locks.hold(relpath, self.lock_timeout_s):
            self.manifest.refresh()
            entry = self.manifest.get(relpath)
            if entry is not None and entry != bad:  # another process staged it while this one waited
                data = self._read_local(relpath, entry)
                if data is not None:
                    return data
            if entry is not None:  # the copy failed verification (or vanished): replace it
                self._count("corrupt_staged")
                self.manifest.remove(relpath)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.local_path(relpath))
            data = self._read_remote(relpath)
            with self._budget_held():
                if self._room_for(len(data)):
                    self._write_staged(relpath, data)
                    return data
            self._count("unstaged_reads")
            return data

    @contextlib.contextmanager
    def _budget_held(self) -> Any:
        """The budget's check and the manifest record as one step across processes (no lock without a budget)."""
        if self.budget_bytes is None:
            yield
            return
        with self.budget_lock.hold("budget", self.lock_timeout_s):
            self.manifest.refresh()  # what other processes staged counts against the budget
            yield

    def _write_staged(self, relpath: str, data: bytes) -> None:
        """Copy ``data`` into place (tmp file, rename, manifest record); on a full disk, stop staging instead."""
        known = self._listing.get(relpath)
        tmp = os.path.join(self.tmp_dir, f"{os.getpid()}.{threading.get_ident()}.{next(_tmp_counter)}")
        final = self.local_path(relpath)
        try:
            os.makedirs(os.path.dirname(final), exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, final)
            mtime_ns = known.mtime_ns if known is not None else 0
            self.manifest.add(relpath, Entry(len(data), mtime_ns, zlib.crc32(data)))
        except OSError as e:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            if e.errno not in _NO_SPACE:
                raise
            # The record may be missing: drop the copy so nothing unrecorded lingers.
            if relpath not in self.manifest.entries:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(final)
            self.staging_stopped = f"disk full in {self.stage_dir} ({e.strerror})"
            return
        self._count("staged_here")

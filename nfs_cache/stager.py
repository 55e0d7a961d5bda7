"""``StagedSource``: read a remote dataset through a local stage directory (read-through staging).

The first read of a file copies it to local disk: into ``.coordl/tmp/``, then an atomic rename to ``<relpath>``
(the stage directory mirrors the source), then a manifest record with its size and CRC32. Later reads are local and
verified against that record; a file that fails verification is thrown away and copied again. Several processes
(DataLoader workers, other jobs on the node) may share one stage directory: striped ``flock`` locks make each file be
copied once, and the manifest is an append-only log they all read. When the disk budget (or the disk) is full,
staging stops and reads go to the remote source. The layout is described in ``layout.py``.

The parts, each in a module named for it: opening the stage directory safely (``stagedir.py``), one
copy's write, verified read and removal (``copies.py``), when staging stops (``budget.py``), and staging
the rest in background processes (``prefetch.py``). This class holds the read-through protocol itself.
"""

from __future__ import annotations

import errno
import os
import threading
from typing import Any

from nfs_cache.budget import StageBudget
from nfs_cache.copies import drop_copy, forget_changed, read_verified, write_copy
from nfs_cache.counts import StageCounts
from nfs_cache.entries import RemoteFiles
from nfs_cache.layout import META_DIR, StageLayout
from nfs_cache.locks import StripedLocks
from nfs_cache.manifest import Entry, Manifest
from nfs_cache.sources import RemoteFile, Source, _check_relpath, open_source
from nfs_cache.stagedir import check_stage_dir, claim_stage_dir, remove_dead_tmp, source_identity

__all__ = ["StagedSource", "source_identity"]


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
        check_stage_dir(self.stage_dir, self.source)
        self._open_local_state()
        claim_stage_dir(self.layout, self.source)
        remove_dead_tmp(self.tmp_dir)
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

    def _open_local_state(self) -> None:
        self.layout = StageLayout(self.stage_dir)
        self.tmp_dir = self.layout.tmp
        os.makedirs(self.tmp_dir, exist_ok=True)
        self.manifest = Manifest(self.layout.manifest)
        self.manifest.refresh()
        self.locks = StripedLocks(self.layout.locks)
        self.budget = StageBudget(
            self.layout, self.manifest, self.budget_bytes, self.min_free_bytes, self.lock_timeout_s
        )
        self._listing = RemoteFiles()  # held flat (nfs_cache.entries): workers read it as they stage
        self._listed = False
        self.counts = StageCounts(self.counters)

    @property
    def staging_stopped(self) -> str:
        """Why this process stopped staging ("" while it stages): a budget, free space or a full disk."""
        return self.budget.stopped

    # -- public API ------------------------------------------------------------------------------------------------

    def remote_files(self) -> list[RemoteFile]:
        """The remote files (sorted by path), listed once per instance: listing a large NFS tree is slow.

        Listing also forgets staged copies whose remote file changed size or mtime since they were staged, and
        records the list in the stage directory (so that a partial stage can be told from a complete one). A
        ``.coordl/`` folder at the source's top is another stage directory's bookkeeping and is left out.
        """
        if not self._listed:
            files = [f for f in self.source.list_files() if f.relpath.split("/", 1)[0] != META_DIR]
            files.sort(key=lambda f: f.relpath)  # sorted already (the sources' contract): one pass to check
            known = len(self._listing)
            self._listing.update((f.relpath, f) for f in files)
            self._listed = True
            self.manifest.reserve(len(files))  # the index sized now, not while workers stage
            forget_changed(self.layout, self.manifest, self._listing)
            self.layout.write_listing(
                (f.relpath for f in files), f"{os.getpid()}.{threading.get_ident()}.listing"
            )
            if not known:  # nothing added before the listing: the source's list is the answer
                return files
        return sorted(self._listing.values(), key=lambda f: f.relpath)

    def staged_mask(self, files: list[RemoteFile]) -> list[bool]:
        """Whether each of ``files`` is staged now, looked up in one pass (flat per file at any count)."""
        staged = self.manifest.lookup([f.relpath for f in files])[0]
        return [bool(x) for x in staged.tolist()]

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
        return self.manifest.get(relpath) is not None

    def local_path(self, relpath: str) -> str:
        """Where the staged copy of ``relpath`` lives (it may not exist yet)."""
        return self.layout.local_path(relpath)

    def describe(self, relpath: str) -> str:
        return self.source.describe(relpath)

    def stats(self) -> dict[str, int]:
        """``staged_items``/``staged_bytes`` (whole node, from the manifest) and ``remote_bytes_read`` (all
        processes when ``counters`` was given, else this process)."""
        self.manifest.refresh()
        files, staged_bytes = self.manifest.totals()
        return {
            "staged_items": files,
            "staged_bytes": staged_bytes,
            "remote_bytes_read": self.counts.remote_bytes_read(),
        }

    def local_stats(self) -> dict[str, int]:
        """This process's counts: ``remote_bytes_read``, ``staged_here`` (copies it made), ``corrupt_staged``
        (copies that failed verification and were replaced), ``unstaged_reads`` (remote reads not staged)."""
        return self.counts.local()

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

    def _read_local(self, relpath: str, entry: Entry) -> bytes | None:
        """The staged bytes, or None when the copy is missing or fails verification."""
        return read_verified(self.local_path(relpath), entry, self.verify)

    def _read_remote(self, relpath: str) -> bytes:
        data = self.source.read(relpath)
        self.counts.add("remote_bytes_read", len(data))
        known = self._listing.get(relpath)
        if known is not None and known.size != len(data):
            raise OSError(
                errno.EIO, f"{self.describe(relpath)}: read {len(data)} bytes, listing says {known.size}"
            )
        return data

    def _stage(self, relpath: str, bad: Entry | None) -> bytes:
        if not self.budget.room_for(self._listing[relpath].size if relpath in self._listing else 0):
            self.counts.add("unstaged_reads")
            return self._read_remote(relpath)
        with self.locks.hold(relpath, self.lock_timeout_s):
            self.manifest.refresh()
            entry = self.manifest.get(relpath)
            if entry is not None and entry != bad:  # another process staged it while this one waited
                data = self._read_local(relpath, entry)
                if data is not None:
                    return data
            if entry is not None:  # the copy failed verification (or vanished): replace it
                self.counts.add("corrupt_staged")
                drop_copy(self.layout, self.manifest, relpath)
            data = self._read_remote(relpath)
            with self.budget.held():
                if self.budget.room_for(len(data)):
                    self._write_staged(relpath, data)
                    return data
            self.counts.add("unstaged_reads")
            return data

    def _write_staged(self, relpath: str, data: bytes) -> None:
        """Put the copy in place and record it; on a full disk, stop staging instead."""
        known = self._listing.get(relpath)
        stopped = write_copy(
            self.layout, self.manifest, relpath, data, known.mtime_ns if known is not None else 0
        )
        if stopped:
            self.budget.stop(stopped)
            return
        self.counts.add("staged_here")

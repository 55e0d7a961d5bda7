"""Stage the rest of a dataset ahead of the reader: copy processes in the background (also used by
:func:`nfs_cache.bulk.stage_all`, ``coordl stage``).

The copying runs in separate processes (``python -m nfs_cache.copier``), not threads: the libnfs binding holds the
GIL during an NFS call, so a prefetch thread would stall the training loop, and one libnfs context is not safe to
share between threads. Each process stages its shard of the file list (sent on stdin as text, never pickled)
through a ``StagedSource`` on the same stage directory, so locks and the manifest keep it from copying a file that
a training worker is copying, and a re-run skips everything already staged. A child exits by itself when its
parent dies.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.parse
from typing import Any

from nfs_cache.sources import RemoteFile

__all__ = ["BackgroundPrefetch", "spawn_shards", "stop_all"]


def spawn_shards(
    url: str, stage_dir: str, files: list[RemoteFile], budget_bytes: int | None, workers: int
) -> list[subprocess.Popen]:
    procs = []
    for shard in range(workers):
        cmd = [sys.executable, "-m", "nfs_cache.copier", url, stage_dir, "--parent-pid", str(os.getpid())]
        if budget_bytes is not None:
            cmd += ["--budget-bytes", str(budget_bytes)]
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, text=True)
        procs.append(proc)
        # Interleaved shards: every process walks the whole tree, so small and large directories spread evenly.
        listing = "".join(
            f"{f.size} {f.mtime_ns} {urllib.parse.quote(f.relpath)}\n" for f in files[shard::workers]
        )
        threading.Thread(target=_feed, args=(proc, listing), daemon=True).start()
    return procs


def _feed(proc: subprocess.Popen, listing: str) -> None:
    try:
        assert proc.stdin is not None
        proc.stdin.write(listing)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass  # the child died or was stopped; its exit status tells the rest


def stop_all(procs: list[subprocess.Popen], timeout_s: float = 10.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


class BackgroundPrefetch:
    """Stages every file of ``staged`` (a :class:`nfs_cache.stager.StagedSource`) that is not staged yet,
    in ``workers`` background processes."""

    def __init__(self, staged: Any, files: list[RemoteFile], workers: int = 1) -> None:
        todo = [f for f, done in zip(files, staged.staged_mask(files), strict=True) if not done]
        self._procs = spawn_shards(staged.source.url, staged.stage_dir, todo, staged.budget_bytes, workers)

    def wait(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        for p in self._procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
        return True

    def stop(self) -> None:
        stop_all(self._procs)

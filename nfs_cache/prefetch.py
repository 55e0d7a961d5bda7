"""Stage the rest of a dataset ahead of the reader: a background prefetch and ``stage_all`` (``coordl stage``).

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

from nfs_cache.sources import RemoteFile, Source, open_source
from nfs_cache.stager import StagedSource

__all__ = ["BackgroundPrefetch", "stage_all"]


def _spawn_shards(
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


def _stop(procs: list[subprocess.Popen], timeout_s: float = 10.0) -> None:
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
    """Stages every file of ``staged`` that is not staged yet, in ``workers`` background processes."""

    def __init__(self, staged: StagedSource, files: list[RemoteFile], workers: int = 1) -> None:
        staged.manifest.refresh()
        todo = [f for f in files if f.relpath not in staged.manifest.entries]
        self._procs = _spawn_shards(staged.source.url, staged.stage_dir, todo, staged.budget_bytes, workers)

    def wait(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        for p in self._procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
        return True

    def stop(self) -> None:
        _stop(self._procs)


def stage_all(
    src: str | os.PathLike | Source,
    dst: str | os.PathLike,
    *,
    progress: bool = True,
    workers: int = 1,
    budget_bytes: int | None = None,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """Stage every file of ``src`` into ``dst`` now; safe to interrupt and re-run (staged files are skipped).

    Returns a summary: ``files``/``bytes`` (whole dataset), ``staged_files``/``staged_bytes`` (copied by this
    call), ``already_files`` (staged before), ``unstaged_files`` (left remote: budget or disk full),
    ``seconds``, ``mb_per_s`` (copied megabytes, 1e6 bytes, per second).
    """
    source = open_source(src)
    staged = StagedSource(source, dst, budget_bytes=budget_bytes)
    files = source.list_files()
    staged.manifest.refresh()
    before_files = len(staged.manifest.entries)
    before_bytes = staged.manifest.total_bytes
    todo = [f for f in files if f.relpath not in staged.manifest.entries]
    total_bytes = sum(f.size for f in files)
    start = time.monotonic()
    bar = _progress_bar(sum(f.size for f in todo), len(todo)) if progress and todo else None
    try:
        if workers <= 1 or len(todo) <= 1:
            # One copy stream: stage in this process, no interpreter start-up (about 0.3 s on a busy machine).
            for f in todo:
                if timeout_s is not None and time.monotonic() - start > timeout_s:
                    raise TimeoutError(
                        f"staging {source.url} into {staged.stage_dir} took over {timeout_s} s"
                    )
                staged.add_listing([f])
                if staged.staging_stopped:
                    break
                staged.read(f.relpath)
                if bar is not None:
                    bar.update(f.size)
        else:
            _copy_in_processes(staged, todo, workers, budget_bytes, start, timeout_s, bar)
    finally:
        if bar is not None:
            bar.close()
    seconds = time.monotonic() - start
    staged.manifest.refresh()
    copied = staged.manifest.total_bytes - before_bytes
    summary = {
        "files": len(files),
        "bytes": total_bytes,
        "staged_files": len(staged.manifest.entries) - before_files,
        "staged_bytes": copied,
        "already_files": before_files,
        "unstaged_files": len(files) - len(staged.manifest.entries),
        "seconds": seconds,
        "mb_per_s": copied / 1e6 / seconds if seconds > 0 else 0.0,
    }
    staged.close()
    return summary


def _copy_in_processes(
    staged: StagedSource,
    todo: list[RemoteFile],
    workers: int,
    budget_bytes: int | None,
    start: float,
    timeout_s: float | None,
    bar: Any,
) -> None:
    before_files, before_bytes = len(staged.manifest.entries), staged.manifest.total_bytes
    procs = _spawn_shards(staged.source.url, staged.stage_dir, todo, budget_bytes, min(workers, len(todo)))
    shown = 0.0
    try:
        while any(p.poll() is None for p in procs):
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                raise TimeoutError(
                    f"staging {staged.source.url} into {staged.stage_dir} took over {timeout_s} s"
                )
            time.sleep(0.05)
            if bar is not None and time.monotonic() - shown > 0.2:
                shown = time.monotonic()
                staged.manifest.refresh()
                bar.n = staged.manifest.total_bytes - before_bytes
                bar.set_postfix(files=len(staged.manifest.entries) - before_files, refresh=True)
    finally:
        _stop(procs)
    failed = [p.returncode for p in procs if p.returncode not in (0, None)]
    if failed:
        raise RuntimeError(
            f"staging {staged.source.url} into {staged.stage_dir}: a copy process failed (exit {failed})"
        )


def _progress_bar(total_bytes: int, total_files: int) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total_bytes, unit="B", unit_scale=True, desc=f"staging {total_files} files", file=sys.stderr
    )

"""Opening a stage directory safely, before anything is staged into it.

A stage directory is refused when using it would damage or misread something (:func:`check_stage_dir`:
an old layout, a directory inside the source, a file, someone's non-empty folder), claimed for one source
so two datasets never mix in it (:func:`claim_stage_dir`), and cleared of the copies in progress of
processes that died (:func:`remove_dead_tmp`). The layout itself is described in ``layout.py``.
"""

from __future__ import annotations

import contextlib
import os
import urllib.parse

from nfs_cache.layout import META_DIR, StageDirError, StageLayout, old_layout_message
from nfs_cache.sources import Source

__all__ = ["source_identity", "check_stage_dir", "claim_stage_dir", "remove_dead_tmp"]


def source_identity(source: Source) -> str:
    """The source's address without URL options (an ``nfsport`` may change between runs, the data does not)."""
    return (
        urllib.parse.urlsplit(source.url)._replace(query="").geturl() if "://" in source.url else source.url
    )


def check_stage_dir(stage_dir: str, source: Source) -> None:
    """Refuse a directory that staging ``source`` would damage or misread (before anything is written to it)."""
    layout = StageLayout(stage_dir)
    if layout.is_old_layout():
        raise StageDirError(old_layout_message(stage_dir))
    root = getattr(source, "root", None)
    if root is not None:  # a mounted directory: the copies must not land inside the source (or be it)
        src, dst = os.path.realpath(root), os.path.realpath(stage_dir)
        if os.path.commonpath([src, dst]) in (src, dst):
            raise StageDirError(
                f"stage_dir {stage_dir!r} and the source {root!r} overlap: "
                "stage into a directory outside the dataset"
            )
    if os.path.exists(stage_dir) and not os.path.isdir(stage_dir):
        raise StageDirError(f"stage_dir {stage_dir!r} is a file, not a directory")
    if layout.is_stage_dir() or not os.path.isdir(stage_dir):
        return
    # Staged copies mirror the source at the top of stage_dir: never mix them into someone's folder.
    foreign = sorted(n for n in os.listdir(stage_dir) if not n.startswith(".") and n != "lost+found")
    if foreign:
        raise StageDirError(
            f"stage_dir {stage_dir!r} is not empty ({', '.join(foreign[:3])}...) and is not a stage "
            f"directory (no {META_DIR}/): use a new or empty directory"
        )


def claim_stage_dir(layout: StageLayout, source: Source) -> None:
    """Record ``source`` as the one this directory stages; refuse a directory that holds another source."""
    path = layout.source_file
    ident = source_identity(source)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        with open(path, encoding="utf-8") as f:
            owner = f.read().strip()
        if owner and owner != ident:
            raise ValueError(
                f"stage_dir {layout.root!r} holds a staged copy of {owner!r}, not of {ident!r}: "
                "use another stage_dir (or delete this one)"
            ) from None
        return
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(ident + "\n")


def remove_dead_tmp(tmp_dir: str) -> None:
    """Delete the copies in progress (``<pid>.<thread>.<n>``) of processes that no longer run."""
    # Copies in progress of processes that died (kill -9, OOM) would otherwise fill the disk over restarts.
    for name in os.listdir(tmp_dir):
        try:
            pid = int(name.split(".", 1)[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _pid_alive(pid):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(tmp_dir, name))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

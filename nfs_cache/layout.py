"""Where things live in a stage directory, and how to tell what a directory is.

A stage directory mirrors its source: ``DST/<relpath>`` is the staged copy of ``SRC/<relpath>``, so after
``coordl stage SRC DST`` the folder ``DST`` is itself a dataset (``coordl.ImageFolder(DST)`` sees the source's
classes). Everything else is hidden in ``DST/.coordl/``, which dataset scanners skip like any hidden folder::

    DST/<relpath>               staged copies (complete files only: they are renamed into place)
    DST/.coordl/source.txt      the source it belongs to (refuses to mix two datasets in one directory)
    DST/.coordl/manifest.log    what is staged, with sizes and CRC32s (see manifest.py)
    DST/.coordl/index.bin       the manifest's entries as a hash table every process maps (see index.py)
    DST/.coordl/listing.txt     the source's file list when it was last listed (tells a partial stage apart)
    DST/.coordl/tmp/            copies in progress, named <pid>.<thread>.<n>, on DST's filesystem
    DST/.coordl/locks/          lock stripes

Before this layout, coordl kept copies in ``DST/files/`` beside ``DST/manifest.log``; such a directory read as a
dataset has one class, ``files``. It is recognised and refused with the commands that convert it.
"""

from __future__ import annotations

import contextlib
import os
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = [
    "META_DIR",
    "StageDirError",
    "StageLayout",
    "StageStatus",
    "stage_status",
    "old_layout_message",
    "check_plain_dataset",
]

META_DIR = ".coordl"
_LISTING_HEADER = "# coordl stage listing v1: one percent-encoded relative path per line\n"


class StageDirError(ValueError):
    """A stage directory that cannot be used as asked (old layout, partial stage, not a stage directory)."""


@dataclass(frozen=True)
class StageLayout:
    """The paths of one stage directory (``root`` is absolute)."""

    root: str

    @property
    def meta(self) -> str:
        return os.path.join(self.root, META_DIR)

    @property
    def manifest(self) -> str:
        return os.path.join(self.meta, "manifest.log")

    @property
    def source_file(self) -> str:
        return os.path.join(self.meta, "source.txt")

    @property
    def listing_file(self) -> str:
        return os.path.join(self.meta, "listing.txt")

    @property
    def tmp(self) -> str:
        return os.path.join(self.meta, "tmp")

    @property
    def locks(self) -> str:
        return os.path.join(self.meta, "locks")

    def local_path(self, relpath: str) -> str:
        return os.path.join(self.root, *relpath.split("/"))

    def is_stage_dir(self) -> bool:
        return os.path.isfile(self.source_file) or os.path.isfile(self.manifest)

    def is_old_layout(self) -> bool:
        """True for a stage directory written before the mirrored layout (``files/`` + ``manifest.log``)."""
        return (
            not os.path.isdir(self.meta)
            and os.path.isdir(os.path.join(self.root, "files"))
            and os.path.isfile(os.path.join(self.root, "manifest.log"))
        )

    def write_listing(self, relpaths: Iterable[str], tmp_name: str) -> None:
        """Record the source's file list (tmp file + rename: a reader sees the old list or the new one)."""
        tmp = os.path.join(self.tmp, tmp_name)
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(_LISTING_HEADER)
                f.writelines(urllib.parse.quote(r) + "\n" for r in relpaths)
            os.replace(tmp, self.listing_file)
        except OSError:
            # The record only improves error messages; a full disk must not stop staging (or training).
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def read_listing(self) -> list[str] | None:
        """The recorded file list, or None when the source was never listed into this directory."""
        try:
            with open(self.listing_file, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return None
        return [urllib.parse.unquote(line) for line in lines if line and not line.startswith("#")]

    def read_source(self) -> str:
        try:
            with open(self.source_file, encoding="utf-8") as f:
                return f.read().strip()
        except FileNotFoundError:
            return ""


def old_layout_message(root: str) -> str:
    """What to do with a stage directory in the old layout (copies in ``files/``)."""
    source = ""
    with contextlib.suppress(OSError), open(os.path.join(root, "source.txt"), encoding="utf-8") as f:
        source = f.read().strip()
    src = source or "SRC"
    return (
        f"{root} is a stage directory in the layout of an older coordl (copies in {root}/files/, "
        f"{root}/manifest.log); read as a dataset it would have one class, 'files'. Re-stage it: "
        f"rm -rf {root} && coordl stage {src} {root} -- or convert it in place (no copying): "
        f"cd {root} && mkdir .coordl && mv manifest.log source.txt .coordl/ && rm -rf tmp locks && "
        f"mv files .coordl/old && mv .coordl/old/* . && rmdir .coordl/old"
    )


@dataclass(frozen=True)
class StageStatus:
    """What a stage directory holds: its source, and the source's files that are not staged (None: unknown)."""

    root: str
    source: str
    listed: int | None
    missing: list[str] | None


def stage_status(root: str | os.PathLike, wanted: Callable[[str], bool] | None = None) -> StageStatus:
    """Compare ``root``'s recorded source listing with the files present under ``root``.

    ``wanted``: which listed relative paths a reader uses (e.g. images only); default all. A file counts as staged
    when it exists locally under its listed name: copies are renamed into place only when complete.
    """
    layout = StageLayout(os.path.abspath(os.fspath(root)))
    listed = layout.read_listing()
    if listed is None:
        return StageStatus(layout.root, layout.read_source(), None, None)
    want = listed if wanted is None else [r for r in listed if wanted(r)]
    missing = [r for r in want if not os.path.isfile(layout.local_path(r))]
    return StageStatus(layout.root, layout.read_source(), len(want), missing)


def check_plain_dataset(root: str, keep: Callable[[str], bool], who: str) -> None:
    """Raise StageDirError when ``root``, read as a plain folder of files, would give wrong classes or labels.

    A complete stage directory (``coordl stage SRC DST`` ran to the end) mirrors its source and reads as one. An
    old-layout one (copies under ``files/``) would be a single class; a partial one would miss files, or whole
    classes, and so shift every label after them. ``keep``: which relative paths the reader uses; ``who``: the
    caller, for the message (e.g. ``ImageFolder('/data')``).
    """
    layout = StageLayout(os.path.abspath(root))
    if layout.is_old_layout():
        raise StageDirError(f"{who}: {old_layout_message(root)}")
    if not layout.is_stage_dir():
        return
    status = stage_status(root, keep)
    src = status.source or "SRC"
    how = (
        f"use ImageFolder({src!r}, stage_dir={root!r}) (reads what is missing from the source and stages it), "
        f"or finish staging first: coordl stage {src} {root}"
    )
    if status.missing is None:
        raise StageDirError(
            f"{who}: {root} is a stage directory of {src} with no record of the source's file list, so it "
            f"cannot tell whether it is complete; {how}"
        )
    if status.missing:
        raise StageDirError(
            f"{who}: {root} is a partial stage of {src}: {len(status.missing)} of {status.listed} files are not "
            f"staged yet (e.g. {status.missing[0]}), so classes and labels would be wrong; {how}"
        )

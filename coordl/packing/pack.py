"""``coordl pack SRC DST --format lmdb|tar``: convert a dataset into an LMDB environment or tar shards.

Each record is the source item's stored bytes (``fetch``; nothing is decoded or re-encoded) and its
label; with ``--crop-index`` each JPEG is first rewritten losslessly with restart segments
(:mod:`coordl.prep.cropindex`: same pixels, crop decode entropy-decodes only the crop). The pack is

* **resumable**: an LMDB pack commits every few MB and knows how far it got from the record count; a
  tar pack writes each shard as ``*.partial``, renames it when complete and records it in
  ``DST/.coordl-pack/`` (:mod:`coordl.packing.tarstate`). Running the same command after a kill continues where it stopped; a
  DST that holds a pack of another source is refused.
* **verified**: after writing, every record is read back through :class:`coordl.LMDBDataset` /
  :class:`coordl.TarShards` (the readers training will use) and its CRC32 and label compared with
  what was read from the source. The command exits 0 only when every record matched.

It prints the source's and the pack's sizes. SRC is an ImageFolder directory, an LMDB environment or
tar shards; :func:`pack` takes any item source with ``targets`` (``coordl.ImageFolder`` ...).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from coordl.packing.items import SourceItems
from coordl.packing.lmdb import pack_lmdb, verify_lmdb
from coordl.packing.tar import pack_tar, verify_tar

__all__ = ["pack", "PackResult", "open_dataset", "add_parser", "main", "DEFAULT_SHARD_MB"]

DEFAULT_SHARD_MB = 256


@dataclass
class PackResult:
    """What a pack did: items written now and in total, verification outcome, sizes in bytes."""

    items: int
    written_now: int
    verified: int
    mismatches: list[str] = field(default_factory=list)
    source_bytes: int = 0
    source_files: int = 0
    source_alloc_bytes: int = 0
    packed_bytes: int = 0
    packed_files: int = 0
    pattern: str = ""

    @property
    def ok(self) -> bool:
        return not self.mismatches and self.verified == self.items


def open_dataset(src: str) -> Any:
    """An LMDB environment, tar shards (a ``.tar`` pattern or a directory of shards) or an ImageFolder."""
    from coordl.datasets.files import ImageFolder

    if os.path.isfile(os.path.join(src, "data.mdb")) or src.endswith(".mdb"):
        from coordl.packed.lmdb import LMDBDataset

        return LMDBDataset(src)
    if src.endswith(".tar") or (os.path.isdir(src) and any(n.endswith(".tar") for n in os.listdir(src))):
        from coordl.packed.tar import TarShards

        return TarShards(src)
    return ImageFolder(src)


def _source_sizes(source: Any) -> tuple[int, int]:
    """(files, bytes allocated on disk) when the source's items are files; (0, 0) otherwise."""
    describe = getattr(source, "describe", None)
    if not callable(describe) or not len(source) or not os.path.isfile(str(describe(0))):
        return 0, 0
    alloc = 0
    for i in range(len(source)):
        st = os.stat(str(describe(i)))
        alloc += st.st_blocks * 512
    return len(source), alloc


def _packed_sizes(dst: str) -> tuple[int, int]:
    files = total = 0
    for entry in os.scandir(dst):
        if entry.is_file():
            files += 1
            total += entry.stat().st_blocks * 512
    return files, total


def _identity(source: Any) -> str:
    ident = getattr(source, "dataset_identity", None)
    try:
        return str(ident()) if callable(ident) else f"{type(source).__name__}:{len(source)}"
    except AttributeError:  # ImageFolder without a cacheable transform still has the file-list digest
        return f"{type(source).__name__}:{len(source)}"


def pack(source: Any, dst: str | os.PathLike, format: str = "lmdb", *,
         shard_mb: float = DEFAULT_SHARD_MB, progress: bool = True, crop_index: bool = False) -> PackResult:  # fmt: skip
    """Write every item of ``source`` into ``dst`` (``format`` "lmdb" or "tar"), then read each one back.

    Args:
        source: an item source (``fetch``) with ``targets`` (labels; None or absent: no labels).
        dst: the LMDB environment directory, or the directory of the tar shards.
        shard_mb: target shard size for ``tar`` (a shard closes after the item that reaches it).
        progress: show progress on stderr.
        crop_index: store each JPEG rewritten by :func:`coordl.prep.cropindex.add_restarts` (a JPEG
            libjpeg reports damaged, and anything not a JPEG, is stored as it is); verification then
            compares the records with the rewritten bytes. A pack is resumed only with the same choice.

    Returns:
        A :class:`PackResult`; ``result.ok`` is True when every record was read back intact.
    """
    if format not in ("lmdb", "tar"):
        raise ValueError(f"coordl pack: format must be 'lmdb' or 'tar', got {format!r}")
    if shard_mb <= 0:
        raise ValueError(f"coordl pack: --shard-mb must be > 0, got {shard_mb}")
    dst = os.fspath(dst)
    rewrite = None
    if crop_index:
        from coordl.prep.cropindex import rewrite_or_keep

        rewrite = rewrite_or_keep
    items = SourceItems(source, rewrite)
    identity = _identity(source) + ("+crop-index" if crop_index else "")
    if not len(source):
        raise ValueError(f"coordl pack: the source {identity} has no items")
    if format == "lmdb":
        classes = list(getattr(source, "classes", []) or [])
        written = pack_lmdb(items, dst, identity, classes, progress)
        check = verify_lmdb(items, dst, progress)
    else:
        written = pack_tar(items, dst, identity, int(shard_mb * (1 << 20)), progress)
        check = verify_tar(items, dst, progress)
    files, alloc = _source_sizes(source)
    packed_files, packed_bytes = _packed_sizes(dst)
    return PackResult(
        items=len(source), written_now=written, verified=check.verified, mismatches=check.bad,
        source_bytes=check.payload_bytes, source_files=files, source_alloc_bytes=alloc,
        packed_bytes=packed_bytes, packed_files=packed_files, pattern=check.pattern,
    )  # fmt: skip


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _report(result: PackResult, dst: str, fmt: str) -> None:
    resumed = result.items - result.written_now
    print(
        f"packed {result.items} items into {dst} ({fmt})"
        + (f", {resumed} of them by an earlier run" if resumed else "")
    )
    if result.source_files:
        print(
            f"before: {result.source_files} files, {_mb(result.source_bytes)} of data, "
            f"{_mb(result.source_alloc_bytes)} on disk"
        )
    else:
        print(f"before: {result.items} items, {_mb(result.source_bytes)} of data")
    print(f"after:  {result.packed_files} files, {_mb(result.packed_bytes)} on disk")
    if result.pattern:
        print(f"read it with coordl.TarShards({result.pattern!r})")
    else:
        print(f"read it with coordl.LMDBDataset({dst!r})")
    if result.ok:
        print(f"verified: all {result.verified} records read back with matching CRC32 and label")
        return
    print(f"verification FAILED: {result.items - result.verified} of {result.items} records", file=sys.stderr)
    for line in result.mismatches[:20]:
        print(f"  {line}", file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    try:
        source = open_dataset(args.src)
        result = pack(
            source, args.dst, args.format, shard_mb=args.shard_mb, progress=not args.quiet,
            crop_index=args.crop_index,
        )  # fmt: skip
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        print(f"coordl pack: {e}", file=sys.stderr)
        return 2
    _report(result, args.dst, args.format)
    return 0 if result.ok else 1


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``coordl pack SRC DST --format lmdb|tar [--shard-mb 256]``."""
    p = subparsers.add_parser(
        "pack", help="convert an ImageFolder (or LMDB / tar shards) into an LMDB environment or tar shards"
    )
    p.add_argument(
        "src", help="ImageFolder directory, LMDB environment, or tar shards (pattern or directory)"
    )
    p.add_argument("dst", help="output directory (LMDB environment, or where the shards go)")
    p.add_argument("--format", choices=("lmdb", "tar"), required=True, help="what to write")
    p.add_argument("--shard-mb", type=float, default=DEFAULT_SHARD_MB,
                   help=f"tar shard size in MB (default {DEFAULT_SHARD_MB})")  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--crop-index", action="store_true",
                   help="store JPEGs rewritten losslessly with restart segments (coordl crop-index)")  # fmt: skip
    p.set_defaults(func=_run)


def main(argv: list[str] | None = None) -> int:
    """``python -m coordl.packing.pack SRC DST --format ...`` (the same as ``coordl pack``)."""
    parser = argparse.ArgumentParser(prog="coordl")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["pack", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())

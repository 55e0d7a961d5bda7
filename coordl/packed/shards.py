"""Tar shard names and per-shard member indexes, shared by :mod:`coordl.packed.tar` and ``coordl pack``.

* :func:`expand_braces` turns WebDataset's ``data-{000000..000099}.tar`` into the list of names
  (zero padding kept, several groups allowed, ``{a,b}`` lists too), without extra dependencies.
* :class:`ShardIndex` is what a random read of a shard needs, built once by one sequential pass of
  ``tarfile`` over the headers: for every sample (a WebDataset *key*: member path up to the first
  dot of its base name), the data member's offset and size in the shard, and its label read from the
  ``key.cls`` member (ASCII integer).
* An index is stored beside its shard as ``<shard>.idx``: a NumPy ``.npz`` (loaded with
  ``allow_pickle=False``: never unpickled) holding the arrays and a JSON header with the format
  version and the shard's size and mtime, so a changed shard invalidates its index. It is written to
  a temporary name and renamed, so a reader never sees half an index.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shmem.strings import StringArray

__all__ = [
    "expand_braces",
    "split_key",
    "ShardIndex",
    "TruncatedShardError",
    "build_index",
    "load_index",
    "load_uploaded_index",
    "save_index",
    "NO_LABEL",
]

INDEX_VERSION = 1
INDEX_SUFFIX = ".idx"
# Label of a sample that has no (or an unreadable) ``.cls`` member: prep refuses it, never guesses.
NO_LABEL = np.iinfo(np.int64).min

_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_GROUP = re.compile(r"\{([^{}]*)\}")


def expand_braces(pattern: str) -> list[str]:
    """``a-{000..002}.tar`` -> ``[a-000.tar, a-001.tar, a-002.tar]``; ``{x,y}`` lists; groups multiply.

    A range keeps the width of its lower bound (``{0..10}`` gives ``0 .. 10``, ``{000..010}`` gives
    ``000 .. 010``). A pattern without braces is returned as the one name it is.
    """
    match = _GROUP.search(pattern)
    if match is None:
        return [pattern]
    head, body, tail = pattern[: match.start()], match.group(1), pattern[match.end() :]
    rng = _RANGE.fullmatch(match.group(0))
    if rng is not None:
        lo, hi = int(rng.group(1)), int(rng.group(2))
        if hi < lo:
            raise ValueError(f"shard pattern {pattern!r}: range {match.group(0)} goes downwards")
        width = len(rng.group(1))
        choices = [f"{i:0{width}d}" for i in range(lo, hi + 1)]
    elif "," in body:
        choices = body.split(",")
    else:
        raise ValueError(f"shard pattern {pattern!r}: {match.group(0)} is neither {{lo..hi}} nor {{a,b}}")
    return [name for choice in choices for name in expand_braces(head + choice + tail)]


def split_key(member_name: str) -> tuple[str, str]:
    """WebDataset's rule: the key is the path up to the first dot of the base name, the rest the extension."""
    directory, _, base = member_name.rpartition("/")
    stem, dot, ext = base.partition(".")
    key = f"{directory}/{stem}" if directory else stem
    return key, ext.lower() if dot else ""


@dataclass
class ShardIndex:
    """Where each sample of one shard lies: ``offsets[j]``/``sizes[j]`` of its data member, ``labels[j]``."""

    keys: Sequence[str]  # a list while built, a StringArray once read from an .idx file
    exts: Sequence[str]
    offsets: np.ndarray
    sizes: np.ndarray
    labels: np.ndarray
    shard_bytes: int
    shard_mtime_ns: int
    cut: str = ""  # why the shard's end was not indexed (``keep_partial``); "" for a whole shard

    def __len__(self) -> int:
        return len(self.keys)


class TruncatedShardError(ValueError):
    """A shard ends inside a member's header or data: names the shard, the member and its offset."""


def _read_label(tf: tarfile.TarFile, member: tarfile.TarInfo) -> int:
    handle = tf.extractfile(member)
    text = handle.read(64).strip() if handle is not None else b""
    try:
        return int(text)
    except ValueError:
        return NO_LABEL


def build_index(
    path: str, extensions: tuple[str, ...], mtime_ns: int | None = None, *, keep_partial: bool = False
) -> ShardIndex:
    """Index one shard by a sequential pass over its headers (data is skipped, ``.cls`` read).

    Args:
        path: the shard on a local (or mounted) file system.
        extensions: data member extensions, without dots (``("jpg", "png")``); the first one found
            for a key is its data; a key with none is not a sample.
        mtime_ns: the mtime recorded in the index (default: the file's; a staged copy passes the
            remote shard's, which is what a later check compares with).
        keep_partial: on a truncated shard, return the samples that lie entirely before the cut
            (``ShardIndex.cut`` says where) instead of raising.

    Raises:
        TruncatedShardError: the shard ends inside a member or before the end-of-archive marker
            (the message names the shard, the last member and the offset).
    """
    st = os.stat(path)
    data: dict[str, tuple[str, int, int]] = {}
    labels: dict[str, int] = {}
    cut = ""
    last = "(start of shard)"
    try:
        with tarfile.open(path, "r:") as tf:
            for member in tf:
                if member.offset_data + member.size > st.st_size:
                    cut = (
                        f"{path}: truncated: member {member.name} (header at offset {member.offset}) needs "
                        f"{member.size} bytes from offset {member.offset_data}, the shard has {st.st_size}"
                    )
                    break
                last = f"{member.name} (header at offset {member.offset})"
                key, ext = split_key(member.name)
                if not member.isfile():
                    continue
                if ext == "cls":
                    labels[key] = _read_label(tf, member)
                elif ext in extensions and key not in data:
                    data[key] = (ext, member.offset_data, member.size)
            if not cut:
                cut = _check_end_marker(path, tf.offset, st.st_size, last)
    except tarfile.TarError as e:
        cut = f"{path}: unreadable tar data after {last}: {e}"
    if cut and not keep_partial:
        raise TruncatedShardError(cut)
    keys = list(data)
    return ShardIndex(
        keys=keys,
        exts=[data[k][0] for k in keys],
        offsets=np.array([data[k][1] for k in keys], dtype=np.int64),
        sizes=np.array([data[k][2] for k in keys], dtype=np.int64),
        labels=np.array([labels.get(k, NO_LABEL) for k in keys], dtype=np.int64),
        shard_bytes=st.st_size,
        shard_mtime_ns=st.st_mtime_ns if mtime_ns is None else mtime_ns,
        cut=cut,
    )


def _check_end_marker(path: str, end_offset: int, size: int, last: str) -> str:
    """Empty when two zero blocks follow the last member; else why the shard looks cut off.

    ``tarfile`` treats a header cut in half as the end of the archive, silently: this check is what
    turns that into an error instead of quietly losing the shard's last samples.
    """
    with open(path, "rb") as f:
        f.seek(end_offset)
        tail = f.read(1024)
    if len(tail) == 1024 and not tail.strip(b"\0"):
        return ""
    return f"{path}: truncated after member {last}: no end-of-archive marker at offset {end_offset} (size {size})"


def _blob(strings: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """The ``.idx`` file's two arrays of ``strings``: their UTF-8 bytes and where each ends."""
    flat = strings if isinstance(strings, StringArray) else StringArray(list(strings))
    return np.frombuffer(flat.blob, dtype=np.uint8), flat.ends[1:]


def _unblob(blob: np.ndarray, ends: np.ndarray) -> StringArray:
    """The strings of an ``.idx`` file, held flat as they are stored (no ``str`` per sample)."""
    return StringArray.from_arrays(blob.tobytes(), np.concatenate([np.zeros(1, np.int64), ends]))


def index_bytes(index: ShardIndex, extensions: tuple[str, ...]) -> bytes:
    """The ``.idx`` file content of ``index``."""
    header = {
        "version": INDEX_VERSION,
        "shard_bytes": index.shard_bytes,
        "shard_mtime_ns": index.shard_mtime_ns,
        "extensions": list(extensions),
        "cut": index.cut,
    }
    keys, key_ends = _blob(index.keys)
    exts, ext_ends = _blob(index.exts)
    out = io.BytesIO()
    np.savez(
        out,
        header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8),
        keys=keys,
        key_ends=key_ends,
        exts=exts,
        ext_ends=ext_ends,
        offsets=index.offsets,
        sizes=index.sizes,
        labels=index.labels,
    )
    return out.getvalue()


def save_index(index: ShardIndex, path: str, extensions: tuple[str, ...]) -> None:
    """Write ``index`` to ``path`` atomically (temporary file in the same directory, then rename)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(index_bytes(index, extensions))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_uploaded_index(data: bytes, shard_bytes: int, extensions: tuple[str, ...]) -> ShardIndex | None:
    """An ``.idx`` uploaded to a bucket beside its shard, or None when it cannot serve ``extensions``.

    Checked by the shard's size (uploading gives the object a new mtime). An index written for more extensions
    (``coordl pack`` adds ``bin``) still serves when ``extensions`` are among its own in the same order: a key's
    data member is then the same, and samples whose member has another extension are dropped.
    """
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            header = json.loads(z["header"].tobytes().decode())
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError):
        return None
    theirs = tuple(header.get("extensions", ()))
    if tuple(e for e in theirs if e in extensions) != tuple(extensions):
        return None
    index = load_index(data, shard_bytes, int(header.get("shard_mtime_ns", -1)), theirs)
    if index is None or all(e in extensions for e in index.exts):
        return index
    keep = np.array([e in extensions for e in index.exts], dtype=bool)
    return ShardIndex(
        keys=[k for k, y in zip(index.keys, keep, strict=True) if y],
        exts=[e for e, y in zip(index.exts, keep, strict=True) if y],
        offsets=index.offsets[keep], sizes=index.sizes[keep], labels=index.labels[keep],
        shard_bytes=index.shard_bytes, shard_mtime_ns=index.shard_mtime_ns, cut=index.cut,
    )  # fmt: skip


def load_index(
    data: bytes, shard_bytes: int, shard_mtime_ns: int, extensions: tuple[str, ...]
) -> ShardIndex | None:
    """Parse an ``.idx`` file; None when it is stale (shard size/mtime, extensions, version) or unreadable."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            header = json.loads(z["header"].tobytes().decode())
            fresh = (
                header.get("version") == INDEX_VERSION
                and header.get("shard_bytes") == shard_bytes
                and header.get("shard_mtime_ns") == shard_mtime_ns
                and tuple(header.get("extensions", ())) == tuple(extensions)
            )
            if not fresh:
                return None
            index = ShardIndex(
                keys=_unblob(z["keys"], z["key_ends"]),
                exts=_unblob(z["exts"], z["ext_ends"]),
                offsets=z["offsets"].astype(np.int64),
                sizes=z["sizes"].astype(np.int64),
                labels=z["labels"].astype(np.int64),
                shard_bytes=shard_bytes,
                shard_mtime_ns=shard_mtime_ns,
                cut=str(header.get("cut", "")),
            )
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError):
        return None  # a damaged index is rebuilt, not trusted
    n = len(index.keys)
    if not (len(index.exts) == len(index.offsets) == len(index.sizes) == len(index.labels) == n):
        return None
    if n and int((index.offsets + index.sizes).max()) > shard_bytes:
        return None
    return index

"""The tar side of ``coordl pack``: WebDataset shards written whole or not at all, then a read-back check.

Each shard is written as ``data-NNNNNN.tar.partial``, fsynced, renamed and indexed (``.idx`` beside
it); then ``DST/.coordl-pack/data-NNNNNN.json`` records it with the CRC32 of every payload (the resume
state, :mod:`coordl.packing.tarstate`: bytes written per shard do not grow with the shards before it).
A rerun after a kill drops the ``.partial`` file and continues with the first item of the shard it was
writing.
"""

from __future__ import annotations

import base64
import io
import os
import tarfile
import zlib

import numpy as np

from coordl.packed.shards import INDEX_SUFFIX, build_index, save_index
from coordl.packing.items import Progress, SourceItems, Verification, sniff_ext, verify_items
from coordl.packing.tarstate import STATE_FILE, PackState

__all__ = ["pack_tar", "verify_tar", "tar_pattern", "STATE_FILE"]


def _add_member(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0  # fixed metadata: the same input packs the same
    tf.addfile(info, io.BytesIO(data))


class _ShardWriter:
    """Writes one shard as ``<name>.partial``; ``finish`` fsyncs, renames and indexes it."""

    def __init__(self, dst: str, number: int, extensions: tuple[str, ...]) -> None:
        self.name = f"data-{number:06d}.tar"
        self.path = os.path.join(dst, self.name)
        self.extensions = extensions
        self.file = open(self.path + ".partial", "wb")  # noqa: SIM115 - closed in finish()
        self.tar = tarfile.open(fileobj=self.file, mode="w", format=tarfile.PAX_FORMAT)  # noqa: SIM115
        self.keys: set[str] = set()
        self.crcs: list[int] = []

    def add(self, key: str, ext: str, payload: bytes, label: int | None, index: int) -> None:
        if key in self.keys:  # two source names that map to one key ("a.b.jpg", "a_b.jpg")
            key = f"{key}_{index}"
        self.keys.add(key)
        if label is not None:
            _add_member(self.tar, f"{key}.cls", str(label).encode())
        _add_member(self.tar, f"{key}.{ext}", payload)
        self.crcs.append(zlib.crc32(payload))

    def size(self) -> int:
        return self.file.tell()

    def finish(self) -> dict:
        self.tar.close()
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.path + ".partial", self.path)
        save_index(build_index(self.path, self.extensions), self.path + INDEX_SUFFIX, self.extensions)
        crcs = np.array(self.crcs, dtype="<u4").tobytes()
        return {"name": self.name, "count": len(self.crcs), "crc32": base64.b64encode(crcs).decode()}


def pack_tar(items: SourceItems, dst: str, identity: str, shard_bytes: int, progress: bool) -> int:
    from coordl.datasets.files import IMG_EXTENSIONS

    n = len(items.source)
    os.makedirs(dst, exist_ok=True)
    state = PackState.start(dst, identity, n, shard_bytes)
    for name in os.listdir(dst):  # a shard a killed run was writing
        if name.endswith(".partial"):
            os.unlink(os.path.join(dst, name))
    done = state.items_done
    extensions = tuple(e.lstrip(".") for e in IMG_EXTENSIONS) + ("bin",)
    bar = Progress(n, done, "pack tar", progress)
    writer: _ShardWriter | None = None
    for i in range(done, n):
        if writer is None:
            writer = _ShardWriter(dst, len(state.shards), extensions)
        payload, label = items.get(i)
        key, ext = items.name(i)
        writer.add(key, ext if ext in extensions else sniff_ext(payload), payload, label, i)
        bar.update()
        if writer.size() >= shard_bytes or i == n - 1:
            state.add_shard(len(state.shards), writer.finish())
            writer = None
    bar.close()
    state.finish(list(getattr(items.source, "classes", []) or []))
    return n - done


def tar_pattern(dst: str, shards: int) -> str:
    """The brace pattern naming ``shards`` shards written into ``dst``."""
    return os.path.join(dst, f"data-{{000000..{shards - 1:06d}}}.tar")


def verify_tar(items: SourceItems, dst: str, progress: bool) -> Verification:
    from coordl.datasets.files import IMG_EXTENSIONS
    from coordl.errors import CorruptItemError
    from coordl.packed.tar import TarShards

    state = PackState.read(dst)
    if state is None:
        raise FileNotFoundError(f"coordl pack: {os.path.join(dst, STATE_FILE)} is missing: nothing to verify")
    pattern = tar_pattern(dst, len(state.shards))
    ds = TarShards(pattern, extensions=tuple(IMG_EXTENSIONS) + (".bin",))
    crcs = np.concatenate([np.frombuffer(base64.b64decode(s["crc32"]), dtype="<u4") for s in state.shards])
    out = Verification(pattern=pattern)
    if len(ds) != len(crcs):
        out.bad.append(f"{pattern}: {len(ds)} samples indexed, {len(crcs)} written")

    def payload(i: int) -> bytes:
        data = ds.fetch(i)
        if zlib.crc32(data) != int(crcs[i]):
            raise CorruptItemError(f"{ds.describe(i)}: CRC32 differs from the source item's")
        return data

    return verify_items(ds, items, min(len(ds), len(crcs)), payload, out, progress)

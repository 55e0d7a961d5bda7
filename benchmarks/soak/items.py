"""The soak's dataset: ``n`` tiny items whose bytes derive from their index, so every delivered item checks.

Item ``i`` is ``MAGIC + i`` followed by a BLAKE2b stream seeded by ``i`` (64-575 bytes, the length varies
with ``i`` so a value of another item never has the right length by accident). Prep returns one row,
``[i, h]``, where ``h`` is a 62-bit digest of the bytes prep was given; the job compares ``h`` with
:func:`expected_hash` of ``i``. So an item delivered under the wrong index, or with one wrong byte
(a corrupted cache value served, a torn read) is caught in the batch itself.

:class:`SplitItems` splits prep for the sample cache: ``prep_deterministic`` returns the bytes as a
uint8 array (what memcache stores), ``prep_random`` hashes the array it was given (a cache hit's).
"""

from __future__ import annotations

import hashlib
import time

import numpy as np
import torch

MAGIC = b"SOAK"


def item_size(i: int) -> int:
    return 64 + (i * 37) % 512


def item_bytes(i: int) -> bytes:
    size = item_size(i)
    head = MAGIC + i.to_bytes(4, "little")
    stream = b""
    block = 0
    while len(head) + len(stream) < size:
        stream += hashlib.blake2b(
            i.to_bytes(4, "little") + block.to_bytes(4, "little"), digest_size=64
        ).digest()
        block += 1
    return (head + stream)[:size]


def digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 2


def expected_hash(i: int) -> int:
    return digest(item_bytes(i))


class Items:
    """``n`` items held by "storage" (computed on fetch); ``prep_s`` of CPU-free delay per item."""

    def __init__(self, n: int, prep_s: float = 0.0) -> None:
        self.n, self.prep_s = n, prep_s

    def __len__(self) -> int:
        return self.n

    def fetch(self, index: int) -> bytes:
        return item_bytes(int(index))

    def prep(self, raw: bytes, index: int) -> torch.Tensor:
        if self.prep_s:
            time.sleep(self.prep_s)
        return torch.tensor([int(index), digest(bytes(raw))], dtype=torch.int64)

    def describe(self, index: int) -> str:
        return f"soak://item-{index}"

    def dataset_identity(self) -> str:
        return f"soak-items-{self.n}-v1"


class SplitItems(Items):
    """The same items with prep split for ``sample_cache=``: the cached part is the item's bytes."""

    def prep_deterministic(self, raw: bytes, index: int) -> np.ndarray:
        if self.prep_s:
            time.sleep(self.prep_s)
        return np.frombuffer(bytes(raw), dtype=np.uint8).copy()

    def prep_random(self, array: np.ndarray, index: int) -> torch.Tensor:
        return torch.tensor(
            [int(index), digest(np.asarray(array, dtype=np.uint8).tobytes())], dtype=torch.int64
        )

    def prep_identity(self) -> str:
        return "soak-bytes-v1"


class StagedItems(Items):
    """The same items as files ``%05d.bin`` exported over NFS, staged to a local disk on first read
    (``nfs_cache.StagedSource``: a staged copy is used only when its size and CRC-32 match)."""

    def __init__(self, n: int, url: str, stage_dir: str, prep_s: float = 0.0) -> None:
        from nfs_cache import StagedSource

        super().__init__(n, prep_s)
        # min_free_bytes=0: the soak's stage disk is a 2 MiB tmpfs, the fault fills it
        self.staged = StagedSource(url, stage_dir, min_free_bytes=0, lock_timeout_s=30.0)

    def fetch(self, index: int) -> bytes:
        return bytes(self.staged.read(f"{int(index):05d}.bin"))

    def stats(self) -> dict:
        return dict(self.staged.stats())

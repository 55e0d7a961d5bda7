"""Tiny item sources for the DataLoader/MinIO tests (fetch/prep over in-memory or on-disk bytes)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coordl.errors import CorruptItemError

MAGIC = b"ITEM"


def item_bytes(index: int, size: int = 64) -> bytes:
    """The stored bytes of item ``index``: a header, the index, then filler up to ``size``."""
    body = MAGIC + index.to_bytes(4, "little")
    return body + bytes([index % 251]) * (size - len(body))


def decode(raw: bytes, index: int, path: str | None = None) -> torch.Tensor:
    if raw[:4] != MAGIC:
        raise CorruptItemError(f"{path or f'item {index}'}: not an ITEM record", path=path, index=index)
    return torch.tensor([int.from_bytes(raw[4:8], "little"), raw[-1]], dtype=torch.int64)


class MemorySource:
    """``n`` items of ``size`` bytes held in memory; ``bad`` indices have corrupt bytes."""

    def __init__(
        self, n: int = 40, size: int = 64, bad: tuple[int, ...] = (), kill: int | None = None
    ) -> None:
        self.n, self.size, self.bad, self.kill = n, size, set(bad), kill

    def __len__(self) -> int:
        return self.n

    def fetch(self, index: int) -> bytes:
        if index in self.bad:
            return b"JUNK" * (self.size // 4)
        return item_bytes(index, self.size)

    def prep(self, raw: bytes, index: int) -> torch.Tensor:
        if index == self.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        return decode(raw, index, self.describe(index))

    def describe(self, index: int) -> str:
        return f"mem://item-{index}.bin"


class FileSource:
    """Items stored as files ``<root>/<index>.bin``: fetch reads the file, prep decodes it."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.paths = sorted(Path(root).glob("*.bin"), key=lambda p: int(p.stem))

    def __len__(self) -> int:
        return len(self.paths)

    def fetch(self, index: int) -> bytes:
        return self.paths[index].read_bytes()

    def prep(self, raw: bytes, index: int) -> torch.Tensor:
        return decode(raw, index, str(self.paths[index]))

    def describe(self, index: int) -> str:
        return str(self.paths[index])


def write_files(root: Path, n: int, bad: tuple[int, ...] = ()) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (root / f"{i}.bin").write_bytes(b"JUNKJUNK" if i in bad else item_bytes(i))
    return root


class TorchReference(torch.utils.data.Dataset):
    """The same items as a plain torch map-style dataset, for side-by-side comparison."""

    def __init__(self, source: MemorySource) -> None:
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> Any:
        return self.source.prep(self.source.fetch(index), index)


class PidSource(MemorySource):
    """Each sample carries the pid of the process that prepared it."""

    def prep(self, raw: bytes, index: int) -> torch.Tensor:
        return torch.tensor([index, os.getpid()])


class SlowSource(MemorySource):
    def prep(self, raw: bytes, index: int) -> torch.Tensor:
        time.sleep(2.0)
        return decode(raw, index)


class SplitSource(MemorySource):
    """A source with the deterministic/random prep split (for the sample_cache hook)."""

    def prep_deterministic(self, raw: bytes, index: int) -> np.ndarray:
        return decode(raw, index).numpy()

    def prep_random(self, array: np.ndarray, index: int) -> torch.Tensor:
        return torch.from_numpy(np.asarray(array))

    def prep_identity(self) -> str:
        return "decode-v1"

    def dataset_identity(self) -> str:
        return f"mem-{self.n}"

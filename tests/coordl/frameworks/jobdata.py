"""What the framework jobs train on: 256 items whose raw bytes are their index, and the two loaders.

Imported by the job scripts (run as ``python tests/coordl/frameworks/<job>.py``, so by module name) and
by the tests. Each item's prep returns its index, so a batch says exactly which items a rank got.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
import torch.utils.data

import coordl

NUM_ITEMS = 256
BATCH_SIZE = 16


class Items(torch.utils.data.Dataset):
    """Item ``i`` is stored as 4 bytes holding ``i``; prep returns ``tensor(i)`` (a coordl item source)."""

    def __init__(self, n: int = NUM_ITEMS) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def fetch(self, index: int) -> bytes:
        return int(index).to_bytes(4, "little")

    def prep(self, raw: bytes, index: int) -> torch.Tensor:
        return torch.tensor(int.from_bytes(raw, "little"))

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.prep(self.fetch(index), index)

    def dataset_identity(self) -> str:
        """Names the data, so the ranks of a node share one MinIO cache (coordl.fetch.node_cache)."""
        return f"tests.coordl.frameworks.Items({self.n})"


class UnnamedItems(Items):
    """The same items, with no name for the data: each rank keeps a cache of its own (the baseline)."""

    dataset_identity = None  # type: ignore[assignment]


def make_loader(kind: str, **overrides: Any) -> torch.utils.data.DataLoader:
    """The same arguments to torch's loader or coordl's (which adds a cache holding every item)."""
    args: dict[str, Any] = {
        "batch_size": BATCH_SIZE,
        "shuffle": True,
        "num_workers": 1,
        "generator": torch.Generator().manual_seed(0),
    }
    args.update(overrides)
    if kind == "torch":
        return torch.utils.data.DataLoader(Items(), **args)
    # JOBDATA_PER_RANK_CACHE=1: measure what a cache per rank gives (docs/frameworks.md)
    items = UnnamedItems() if os.environ.get("JOBDATA_PER_RANK_CACHE") == "1" else Items()
    return coordl.DataLoader(items, cache_bytes=1 << 20, **args)


def loader_report(loader: Any) -> dict[str, Any]:
    """What a rank's training loop can say about the loader it was handed."""
    out: dict[str, Any] = {
        "loader_class": f"{type(loader).__module__}.{type(loader).__qualname__}",
        "sampler_class": type(getattr(loader, "sampler", None)).__name__,
        "collate_fn": getattr(
            getattr(loader, "collate_fn", None), "__name__", repr(getattr(loader, "collate_fn", None))
        ),
    }
    if isinstance(loader, coordl.DataLoader):
        out["epoch_stats"] = loader.epoch_stats()
        out["capacity_bytes"] = loader.stats()["capacity_bytes"]
        out["minio_paths"] = list(loader._chain.minio.paths) if loader._chain.minio is not None else []
    return out


def write_rank(out_dir: str, rank: int, record: dict[str, Any]) -> None:
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


def read_ranks(out_dir: str, world: int = 2) -> list[dict[str, Any]]:
    ranks = []
    for r in range(world):
        with open(os.path.join(out_dir, f"rank{r}.json")) as f:
            ranks.append(json.load(f))
    return ranks

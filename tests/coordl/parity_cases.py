"""Datasets and the side-by-side runner for the parity tests (``test_parity*.py``).

Every dataset here is a plain torch dataset defined at module level, so spawned and forkserver workers
can import it. :func:`outcomes` records everything a training loop calling ``next`` sees (each batch as
plain nested lists with dtypes, each error), so two loaders can be compared with ``==``.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.utils.data as tud

import coordl

# Public attributes torch's DataLoader sets from its arguments (compared by value or identity).
TORCH_ATTRIBUTES = (
    "batch_size", "drop_last", "num_workers", "prefetch_factor", "pin_memory", "pin_memory_device",
    "timeout", "persistent_workers", "in_order", "worker_init_fn", "multiprocessing_context", "generator",
)  # fmt: skip


class Items(tud.Dataset):
    """``n`` items ``tensor([i, i*i])``; ``bad`` items raise ``KeyError`` (``bad=None``: every item)."""

    def __init__(self, n: int = 40, bad: frozenset[int] | None = frozenset()) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.bad is None or index in self.bad:
            raise KeyError(f"no label for item {index}")
        return torch.tensor([index, index * index])


class Mixed(Items):
    """Samples with a dict of a tensor, a NumPy array, an int, a float and a string (default_collate's kinds)."""

    def __getitem__(self, index: int) -> dict[str, Any]:
        base = super().__getitem__(index)
        return {
            "x": base.float(),
            "a": np.full(3, index, np.int16),
            "i": index,
            "f": index / 2,
            "s": f"s{index}",
        }


class Keyed(tud.Dataset):
    """Indexed by whatever the sampler yields: ints, lists, tuples, slices, strings (bulk loading)."""

    def __init__(self, n: int = 12) -> None:
        self.data = torch.arange(n * 2).view(n, 2)
        self.names = {f"k{i}": i for i in range(n)}

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return self.data[self.names[key]]
        if isinstance(key, tuple):
            return self.data[list(key)] + 1000
        return self.data[key]


class Batched(Items):
    """A dataset that makes a whole batch in one call (``__getitems__``), marking that it was used."""

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        return [torch.tensor([i, -1, len(indices)]) for i in indices]


class Columns(Items):
    """``__getitems__`` returning a dict of columns (the Hugging Face way), which collate gets as it is."""

    def __getitems__(self, indices: list[int]) -> dict[str, list[int]]:
        return {"idx": list(indices), "sq": [i * i for i in indices]}


class WorkerInfo(Items):
    """Each sample says which worker made it, how many there were, and its seed."""

    def __getitem__(self, index: int) -> torch.Tensor:
        info = tud.get_worker_info()
        if info is None:
            return torch.tensor([index, -1, 0, 0])
        return torch.tensor([index, info.id, info.num_workers, info.seed % 1000])


class Shards(tud.IterableDataset):
    """Worker ``w`` yields ``sizes[w]`` items (some none, some one); without workers, all of them in turn."""

    def __init__(self, sizes: tuple[int, ...], fail_at: int | None = None) -> None:
        self.sizes, self.fail_at = tuple(sizes), fail_at

    def __iter__(self):
        info = tud.get_worker_info()
        workers = [info.id] if info is not None else range(len(self.sizes))
        for w in workers:
            base = sum(self.sizes[:w])
            for k in range(self.sizes[w] if w < len(self.sizes) else 0):
                if base + k == self.fail_at:
                    raise ValueError(f"stream broke at {base + k}")
                yield torch.full((3,), base + k)


class PidShards(Shards):
    """:class:`Shards` whose items say which process made them: ``tensor([value, pid])``."""

    def __iter__(self):
        for item in super().__iter__():
            yield torch.tensor([int(item[0]), os.getpid()])


class Stuck(Items):
    """Item 0 takes ``seconds``; the others are instant."""

    def __init__(self, n: int = 4, seconds: float = 20.0) -> None:
        super().__init__(n)
        self.seconds = seconds

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == 0:
            time.sleep(self.seconds)
        return super().__getitem__(index)


def bad_collate(batch: list) -> Any:
    if any(int(b[0]) == 5 for b in batch):
        raise RuntimeError("collate refused item 5")
    return torch.stack(batch)


def pid_init(worker_id: int) -> None:
    os.environ["PARITY_WORKER"] = str(worker_id)


def plain(obj: Any) -> Any:
    """A batch as comparable plain data: tensors and arrays become (dtype, nested lists)."""
    if isinstance(obj, torch.Tensor):
        return ("tensor", str(obj.dtype), obj.tolist())
    if isinstance(obj, np.ndarray):
        return ("ndarray", str(obj.dtype), obj.tolist())
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, [plain(v) for v in obj])
    return obj


def outcomes(loader: Any, epochs: int = 1, limit: int = 500) -> list[Any]:
    """Per epoch, what a loop that catches errors and calls ``next`` again sees: batches and errors."""
    out: list[Any] = []
    for _ in range(epochs):
        it = iter(loader)
        seen: list[Any] = []
        while len(seen) < limit:
            try:
                batch = next(it)
            except StopIteration:
                break
            except Exception as e:  # noqa: BLE001 - the point is to record it
                seen.append(("error", e))
                continue
            seen.append(("batch", plain(batch)))
        del it
        out.append(seen)
    return out


def same_errors(ours: Any, theirs: Any) -> bool:
    """coordl's error is torch's type (or a subclass) and its first line contains torch's first line."""
    return isinstance(ours, type(theirs)) and str(theirs).split("\n", 1)[0] in str(ours)


def assert_same_outcomes(ours: list[Any], theirs: list[Any], *, ordered: bool = True) -> None:
    assert len(ours) == len(theirs)
    for epoch_ours, epoch_theirs in zip(ours, theirs, strict=True):
        if not ordered:
            epoch_ours, epoch_theirs = sorted(map(repr, epoch_ours)), sorted(map(repr, epoch_theirs))
            assert epoch_ours == epoch_theirs
            continue
        kinds = [k for k, _ in epoch_ours], [k for k, _ in epoch_theirs]
        assert kinds[0] == kinds[1], f"coordl {kinds[0]} vs torch {kinds[1]}"
        for (kind, a), (_, b) in zip(epoch_ours, epoch_theirs, strict=True):
            if kind == "error":
                assert same_errors(a, b), (
                    f"coordl raised {type(a).__name__}: {a}\ntorch raised {type(b).__name__}: {b}"
                )
            else:
                assert a == b


def both(make: Callable[[], Any], **kwargs: Any) -> tuple[Any, Any]:
    """A coordl and a torch loader over fresh copies of the same dataset, with the same arguments.

    ``generator=<seed>``, ``sampler=<callable(dataset, generator)>`` and ``batch_sampler=<callable>`` build
    a separate, identically seeded object for each loader.
    """
    built = []
    for cls in (coordl.DataLoader, tud.DataLoader):
        args = dict(kwargs)
        dataset = make()
        gen = torch.Generator().manual_seed(args["generator"]) if "generator" in args else None
        if "generator" in args:
            args["generator"] = gen
        for key in ("sampler", "batch_sampler"):
            if callable(args.get(key)) and not hasattr(args[key], "__iter__"):
                args[key] = args[key](dataset, torch.Generator().manual_seed(7))
        with warnings.catch_warnings():
            warnings.simplefilter(
                "ignore", UserWarning
            )  # coordl's "runs as one opaque stage", torch's worker count
            built.append(cls(dataset, **args))
    return built[0], built[1]


class Killer(Items):
    """Item ``kill`` kills the worker that prepares it (SIGKILL: no Python cleanup, like the OOM killer)."""

    def __init__(self, n: int = 20, kill: int = 5) -> None:
        super().__init__(n)
        self.kill = kill

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.kill and tud.get_worker_info() is not None:
            os.kill(os.getpid(), 9)
        return super().__getitem__(index)


class Configured(Items):
    """Items scaled by ``factor``, which each worker sets through ``get_worker_info().dataset``."""

    factor = 1

    def __getitem__(self, index: int) -> torch.Tensor:
        return super().__getitem__(index) * self.factor


def configure_worker(worker_id: int) -> None:
    info = tud.get_worker_info()
    assert isinstance(info.dataset, Configured), type(info.dataset)
    info.dataset.factor = 10 + worker_id


class RangeStream(tud.IterableDataset):
    """torch's documented sharding: ``worker_init_fn`` narrows each worker's copy to its part."""

    def __init__(self, start: int = 3, end: int = 17) -> None:
        self.start, self.end = start, end

    def __iter__(self):
        return iter(range(self.start, self.end))


def split_range(worker_id: int) -> None:
    info = tud.get_worker_info()
    dataset = info.dataset
    assert isinstance(dataset, RangeStream), type(dataset)
    per = -(-(dataset.end - dataset.start) // info.num_workers)
    dataset.start = dataset.start + worker_id * per
    dataset.end = min(dataset.start + per, dataset.end)


def _double(x: int) -> int:
    return 2 * x


def _four_long(row: np.ndarray) -> bool:
    return len(row) == 4


def _plus_one(row: list[int]) -> np.ndarray:
    return np.add(row, 1)


def shuffled_pipe(n: int = 20) -> Any:
    """A torch DataPipe: shuffled (under the loader's control) and split between workers."""
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(list(range(n))).shuffle(buffer_size=8).sharding_filter().map(_double)


def rows_pipe() -> Any:
    """A torch DataPipe of NumPy rows, mapped and filtered (no sharding: each worker yields every row)."""
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper([[1, 2, 3, 4], [1, 2, 3, 4, 5, 6], [5, 6, 7, 8]]).map(_plus_one).filter(_four_long)


class Overlong(tud.IterableDataset):
    """Says it has 6 items; every worker yields all 6 (not sharded)."""

    def __iter__(self):
        return iter(range(6))

    def __len__(self) -> int:
        return 6

"""Datasets and the interrupt-and-resume harness shared by the resume tests.

The harness takes ``k`` batches (across epochs), saves the state through a JSON round trip, builds a
new loader under another global seed, loads the state and takes the rest: the concatenation must be
the uninterrupted stream. Module-level classes so that spawned workers can unpickle them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.data


class Items(torch.utils.data.Dataset):
    """Item i is i."""

    def __init__(self, n: int = 14) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return int(i)


class RandomItems(Items):
    """Item i is [i, a draw from the dataset's own RNG]: a worker's draws depend on all it made before,
    so only a restored RNG state gives the same items after a resume (the Stateful protocol)."""

    def __init__(self, n: int = 14) -> None:
        super().__init__(n)
        self.rng = random.Random(5)

    def __getitem__(self, i: int) -> list[int]:
        return [int(i), self.rng.randrange(1000)]

    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss = self.rng.getstate()
        return {"rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


class Cursor:
    """An iterator over a list that saves its position (a Stateful iterator)."""

    def __init__(self, items: list[int]) -> None:
        self.items, self.pos = items, 0

    def __iter__(self) -> Cursor:
        return self

    def __next__(self) -> int:
        if self.pos >= len(self.items):
            raise StopIteration
        self.pos += 1
        return self.items[self.pos - 1]

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos = state["pos"]


class Stream(torch.utils.data.IterableDataset):
    """Worker w of W streams items w, w + W, ... of ``n``; worker 0 stops after two items (a worker
    that finishes early). ``stateful``: the iterator saves its position, else a plain generator."""

    def __init__(self, n: int = 23, *, stateful: bool = True, short: bool = True) -> None:
        self.n, self.stateful, self.short = n, stateful, short

    def _items(self) -> list[int]:
        info = torch.utils.data.get_worker_info()
        w, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        items = list(range(w, self.n, workers))
        return items[:2] if self.short and w == 0 and workers > 1 else items

    def __iter__(self) -> Any:
        items = self._items()
        return Cursor(items) if self.stateful else iter(items)


class OwnIterator(torch.utils.data.IterableDataset):
    """A Stateful dataset that is its own iterator (``__iter__`` rewinds and returns self)."""

    def __init__(self, n: int = 11) -> None:
        self.n, self.pos, self.step = n, 0, 1

    def __iter__(self) -> OwnIterator:
        info = torch.utils.data.get_worker_info()
        self.pos, self.step = (info.id, info.num_workers) if info is not None else (0, 1)
        return self

    def __next__(self) -> int:
        if self.pos >= self.n:
            raise StopIteration
        self.pos += self.step
        return self.pos - self.step

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos = state["pos"]


class SeededStream(Stream):
    """A stream shuffled by each worker's own seed (``get_worker_info().seed``), without any state:
    only the same worker seeds make a replayed epoch the same (torchdata's fast-forward)."""

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        items = self._items()
        random.Random(info.seed if info is not None else 0).shuffle(items)
        return iter(items)


def plain(batch: Any) -> Any:
    """A batch as nested lists, to compare streams."""
    if isinstance(batch, (list, tuple)):
        return [plain(b) for b in batch]
    return batch.tolist() if hasattr(batch, "tolist") else batch


def stream(loader: Any, epochs: int) -> list[Any]:
    return [plain(b) for _ in range(epochs) for b in loader]


def interrupted(
    make: Callable[[], Any], k: int, total: int, *, exhaust: bool = False, load_after_iter: bool = False
) -> list[Any]:
    """The first ``k`` batches from one loader, then the rest (up to ``total``) from a new loader that
    loaded the first one's state (through JSON). ``exhaust``: at an epoch's end, let the iterator
    raise StopIteration before saving (the state between epochs)."""
    torch.manual_seed(0)
    loader = make()
    it, first = iter(loader), []
    while len(first) < k:
        try:
            first.append(plain(next(it)))
        except StopIteration:
            it = iter(loader)
    if exhaust:
        for b in it:
            first.append(plain(b))
    state = json.loads(json.dumps(loader.state_dict()))
    _close(loader)
    torch.manual_seed(1234)  # nothing may depend on the global RNG of the resuming process
    resumed = make()
    if load_after_iter:
        iter(resumed)
    resumed.load_state_dict(state)
    rest: list[Any] = []
    for _ in range(8):
        if len(first) + len(rest) >= total:
            break
        rest.extend(plain(b) for b in resumed)
    _close(resumed)
    return first + rest


def _close(loader: Any) -> None:
    close = getattr(loader, "close", None)
    if callable(close):
        close()

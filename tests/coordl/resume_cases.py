"""Datasets and the interrupt-and-resume harness shared by the resume tests.

The harness takes ``k`` batches (across epochs), saves the state through a JSON round trip, builds a
new loader under another global seed, loads the state and takes the rest: the concatenation must be
the uninterrupted stream. Module-level classes so that spawned workers can unpickle them.
"""

from __future__ import annotations

import json
import random
import time
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


class EpochStream(torch.utils.data.IterableDataset):
    """A generator-backed stream whose dataset is Stateful: worker w of W yields ``(item, epoch)`` for
    its share of ``n`` items (``sizes``: items per worker), resuming from ``pos``; when its generator
    ends it resets ``pos`` and counts an epoch, so a state taken after the end says "the next epoch,
    from its start"."""

    def __init__(self, n: int = 17, *, sizes: list[int] | None = None) -> None:
        self.n, self.sizes = n, sizes
        self.pos, self.epoch = 0, 0

    def _share(self) -> list[int]:
        info = torch.utils.data.get_worker_info()
        w, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if self.sizes is None:
            return list(range(w, self.n, workers))
        if workers == 1:
            return list(range(sum(self.sizes)))
        start = sum(self.sizes[:w])
        return list(range(start, start + self.sizes[w]))

    def __iter__(self) -> Any:
        share = self._share()
        while self.pos < len(share):
            self.pos += 1
            yield (share[self.pos - 1], self.epoch)
        self.pos, self.epoch = 0, self.epoch + 1

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos, self.epoch = state["pos"], state["epoch"]


class PlainStream(EpochStream):
    """:class:`EpochStream`'s items from a plain generator, without any state: resumed by fast-forward."""

    state_dict = None  # type: ignore[assignment]  # the Stateful protocol's way of saying "not Stateful"
    load_state_dict = None  # type: ignore[assignment]

    def __iter__(self) -> Any:
        yield from ((i, 0) for i in self._share())


class GlobalRngItems(Items):
    """Item i is [i, a draw from torch's global RNG]; its state is that RNG's (as a list, for JSON):
    only a state restored at the moment torchdata restores it gives the same draws after a resume."""

    def __getitem__(self, i: int) -> list[int]:
        return [int(i), int(torch.randint(1000, ()).item())]

    def state_dict(self) -> dict[str, Any]:
        return {"rng": torch.get_rng_state().tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(torch.tensor(state["rng"], dtype=torch.uint8))


class FlipStream(torch.utils.data.IterableDataset):
    """A Stateful stream whose items depend on everything it yielded before (a per-phase flip), so a
    worker restored with another worker's or an older state yields other items."""

    def __init__(self, n: int = 40) -> None:
        self.n, self.step, self.flips = n, 0, [0, 0, 0]

    def __iter__(self) -> Any:
        while self.step < self.n:
            self.step += 1
            k = self.step % 3
            self.flips[k] = 1 - self.flips[k]
            yield self.flips[k] * 100 + self.step

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "flips": self.flips}  # the live list, as datasets often hand it out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.flips = state["step"], list(state["flips"])


class SlowItems(Items):
    """Item ``slow`` takes ``delay_s`` to make: with ``in_order=False`` the batches after it overtake it."""

    def __init__(self, n: int = 12, slow: int = 0, delay_s: float = 0.5) -> None:
        super().__init__(n)
        self.slow, self.delay_s = slow, delay_s

    def __getitem__(self, i: int) -> int:
        if int(i) == self.slow:
            time.sleep(self.delay_s)
        return int(i)


class SlowHalves(torch.utils.data.IterableDataset):
    """Worker w of W streams its contiguous share of ``n``; worker 1's first item takes ``delay_s``,
    so with ``in_order=False`` worker 0 finishes first."""

    def __init__(self, n: int = 10, delay_s: float = 0.5) -> None:
        self.n, self.delay_s = n, delay_s

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        w, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        per = -(-self.n // workers)
        for i in range(w * per, min(self.n, (w + 1) * per)):
            if w == 1 and i == w * per:
                time.sleep(self.delay_s)
            yield i


class PlainRngItems(GlobalRngItems):
    """:class:`GlobalRngItems` without a state: each worker's draws follow only the seed torch gives it."""

    state_dict = None  # type: ignore[assignment]  # the Stateful protocol's way of saying "not Stateful"
    load_state_dict = None  # type: ignore[assignment]

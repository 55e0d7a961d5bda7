"""What a mid-epoch checkpoint of the loader costs: ``state_dict()`` time and size, and the time to the
first batch after ``load_state_dict()``, coordl.DataLoader vs torchdata's StatefulDataLoader.

Both loaders on the same map-style dataset (``shuffle=True``, no ``generator=``, the common case) and on
a Stateful ``IterableDataset``, at 10k and 1M items, without workers and with 4. The state is taken
half-way through the first epoch. Size: the bytes of the state as the frameworks store it (pickled,
what ``torch.save`` writes), and for coordl also as JSON (torchdata's state holds tensors: not JSON).
Time: median of ``--calls`` calls of ``state_dict()``; resume: median of ``--runs`` new loaders, from
``load_state_dict`` to the first batch in hand (workers started, the sampler positioned), next to the
same loader's first batch without a state (what resuming adds is the difference).

    .venv/bin/python benchmarks/bench_resume.py [--items 10000 1000000] [--workers 0 4]
"""

from __future__ import annotations

import argparse
import json
import logging
import pickle
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.data
from torchdata.stateful_dataloader import StatefulDataLoader

import coordl


class Items(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return int(i)


class Cursor:
    def __init__(self, start: int, stop: int, step: int) -> None:
        self.pos, self.stop, self.step = start, stop, step

    def __iter__(self) -> Cursor:
        return self

    def __next__(self) -> int:
        if self.pos >= self.stop:
            raise StopIteration
        self.pos += self.step
        return self.pos - self.step

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos = state["pos"]


class Stream(torch.utils.data.IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Cursor:
        info = torch.utils.data.get_worker_info()
        w, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return Cursor(w, self.n, workers)


def _half_epoch_state(make: Callable[[], Any], batches: int, calls: int) -> tuple[Any, float, Any]:
    torch.manual_seed(0)
    loader = make()
    it = iter(loader)
    for _ in range(batches):
        next(it)
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        state = loader.state_dict()
        times.append(time.perf_counter() - t)
    return state, statistics.median(times), (loader, it)


def _first_batch_time(make: Callable[[], Any], state: Any, runs: int) -> float:
    """Median seconds from ``load_state_dict(state)`` (nothing loaded when ``state`` is None) to the
    first batch in hand."""
    times = []
    for _ in range(runs):
        loader = make()
        t = time.perf_counter()
        if state is not None:
            loader.load_state_dict(state)
        next(iter(loader))
        times.append(time.perf_counter() - t)
        getattr(loader, "close", lambda: None)()
    return statistics.median(times)


def measure(kind: str, items: int, workers: int, calls: int, runs: int) -> list[dict[str, Any]]:
    batch = 256
    dataset = Items(items) if kind == "map" else Stream(items)
    args: dict[str, Any] = {"batch_size": batch, "num_workers": workers}
    if kind == "map":
        args["shuffle"] = True
    rows = []
    for name, cls in (("coordl", coordl.DataLoader), ("torchdata", StatefulDataLoader)):

        def make(cls=cls):
            return cls(dataset, **args)

        state, took, keep = _half_epoch_state(make, items // batch // 2, calls)
        try:
            json_bytes = len(json.dumps(state))
        except TypeError:
            json_bytes = None
        rows.append({
            "kind": kind, "items": items, "workers": workers, "loader": name,
            "state_dict_us": took * 1e6, "pickle_bytes": len(pickle.dumps(state)), "json_bytes": json_bytes,
            "resume_s": _first_batch_time(make, state, runs), "fresh_s": _first_batch_time(make, None, runs),
        })  # fmt: skip
        getattr(keep[0], "close", lambda: None)()
        del keep
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 4])
    parser.add_argument("--kinds", nargs="+", default=["map", "iterable"])
    parser.add_argument("--calls", type=int, default=50, help="state_dict() calls timed per loader")
    parser.add_argument("--runs", type=int, default=3, help="resumes timed per loader")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    logging.getLogger("torchdata").setLevel(logging.ERROR)
    print(
        "| dataset | items | workers | loader | state_dict() | state (pickled) | state (JSON) | load -> first batch | fresh first batch |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in args.kinds:
        for items in args.items:
            for workers in args.workers:
                rows = measure(kind, items, workers, args.calls, args.runs)
                for r in rows:
                    js = f"{r['json_bytes']:,} B" if r["json_bytes"] is not None else "not JSON"
                    print(
                        f"| {kind} | {items:,} | {workers} | {r['loader']} | {r['state_dict_us']:.0f} us | "
                        f"{r['pickle_bytes']:,} B | {js} | {r['resume_s'] * 1e3:.0f} ms | {r['fresh_s'] * 1e3:.0f} ms |",
                        flush=True,
                    )
                c, t = rows
                print(
                    f"|  |  |  | coordl / torchdata | {c['state_dict_us'] / t['state_dict_us']:.2f}x | "
                    f"{c['pickle_bytes'] / t['pickle_bytes']:.2f}x |  | {c['resume_s'] / t['resume_s']:.2f}x | {c['fresh_s'] / t['fresh_s']:.2f}x |",
                    flush=True,
                )


if __name__ == "__main__":
    main()

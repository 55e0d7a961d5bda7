"""Synthetic workloads with known timings for the dsanalyzer tests.

``TimedSource`` is a coordl item source (``fetch``/``prep``) and a torch map-style dataset at once:
its fetch sleeps ``fetch_s`` (a storage of ``item_bytes / fetch_s`` bytes/s per reader), its prep
spins for ``prep_s`` of wall time (or sleeps, ``prep_spins=False``), and :func:`sleep_step` is a
step of a set duration.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset

from shmem.counters import SharedCounters


class TimedSource(Dataset):
    """Item source + torch dataset with set fetch/prep durations; records the durations it realised.

    On a loaded machine a sleep or a spin ends late by a scheduling delay; the counters (summed over
    worker processes) let a test compare against what the workload really spent, set + delay.
    """

    def __init__(
        self, items: int, item_bytes: int, fetch_s: float, prep_s: float, prep_spins: bool = True
    ) -> None:
        self.items, self.item_bytes, self.fetch_s, self.prep_s = items, item_bytes, fetch_s, prep_s
        self.prep_spins = prep_spins
        self.counters = SharedCounters(["fetch_ns", "fetch_n", "prep_ns", "prep_n", "cycle_ns", "cycle_n"])
        self._last_start: tuple[int, int] | None = None  # (pid, ns) of this process's previous item

    def __len__(self) -> int:
        return self.items

    def fetch(self, index: int) -> bytes:
        t0 = time.perf_counter_ns()
        if self.fetch_s > 0:
            time.sleep(self.fetch_s)
        self.counters.add_many({"fetch_ns": time.perf_counter_ns() - t0, "fetch_n": 1})
        return bytes([index % 256]) * self.item_bytes

    def prep(self, raw: bytes, index: int) -> torch.Tensor:
        t0 = time.perf_counter_ns()
        if self.prep_spins:  # CPU work
            deadline = time.perf_counter() + self.prep_s
            while time.perf_counter() < deadline:
                pass
        else:  # the same duration without competing for a core (robust on a loaded machine)
            time.sleep(self.prep_s)
        self.counters.add_many({"prep_ns": time.perf_counter_ns() - t0, "prep_n": 1})
        return torch.full((4,), float(raw[0]))

    def __getitem__(self, index: int) -> torch.Tensor:
        # The producer's cycle: from one item's start to the next one's in the same process. Besides
        # fetch and prep it holds what the worker does per batch (collate, send): real producer time.
        now, pid = time.perf_counter_ns(), os.getpid()
        if self._last_start is not None and self._last_start[0] == pid:
            self.counters.add_many({"cycle_ns": now - self._last_start[1], "cycle_n": 1})
        self._last_start = (pid, now)
        return self.prep(self.fetch(index), index)

    def realized_s(self) -> dict:
        """Mean realised seconds per fetch and per prep."""
        c = self.counters.snapshot()
        return {
            "fetch": c["fetch_ns"] / max(1, c["fetch_n"]) / 1e9,
            "prep": c["prep_ns"] / max(1, c["prep_n"]) / 1e9,
            "cycle": c["cycle_ns"] / c["cycle_n"] / 1e9 if c["cycle_n"] else None,
        }


def sleep_step(step_s: float, realized: list[float] | None = None):
    """A training step of ``step_s``; appends each realised duration to ``realized``."""

    def step(batch: object) -> None:
        t0 = time.perf_counter()
        time.sleep(step_s)
        if realized is not None:
            realized.append(time.perf_counter() - t0)

    return step


TRAIN_SCRIPT = """
import os, sys, time
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

class Files(Dataset):
    def __init__(self, root):
        self.samples = [(os.path.join(root, f), 0) for f in sorted(os.listdir(root))]
    def __len__(self):
        return len(self.samples)
    def __getitem__(self, i):
        with open(self.samples[i][0], "rb") as f:
            raw = f.read()
        return torch.from_numpy(np.frombuffer(raw, dtype=np.uint8)[:64].astype(np.float32))

if __name__ == "__main__":
    root = sys.argv[1]
    loader = DataLoader(Files(root), batch_size=4, shuffle=True, num_workers=WORKERS)
    for epoch in range(1000):
        for x in loader:
            time.sleep(0.002)
"""


def write_files(root: Path, n: int = 32, size: int = 4096) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (root / f"{i:04d}.bin").write_bytes(bytes([i % 256]) * size)
    return root


def write_script(path: Path, body: str = TRAIN_SCRIPT, workers: int = 1) -> Path:
    path.write_text(body.replace("WORKERS", str(workers)))
    return path

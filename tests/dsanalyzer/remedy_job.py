"""A small prep-bound coordl job with a split prep, for the remedies' slow tests (``--jobs``, ``--sample-cache-gb``).

``python remedy_job.py DATA [--workers W] [--coordinate NAME] [--sample-cache-bytes N] [--measure B]``: a
``coordl.DataLoader`` over :class:`SplitSource` (each item's file read, then a deterministic prefix of
``--det-ms`` of CPU time making a ``--side`` x ``--side`` x 3 array, then a random tail of ``--rand-ms``: a
random flip) and a training step that is a ``--step-ms`` wait (an accelerator's step leaves the cores to
the loader). Under ``dsanalyzer profile`` it is an ordinary training loop; with ``--measure B`` it prints
``samples_per_s=<float>`` over B batches after ``--warmup`` batches (with a sample cache, whole epochs
after the first, which fills it), then exits.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

import coordl


class SplitSource:
    """A coordl item source whose prep is a deterministic prefix (CPU time, fixed) and a random tail."""

    def __init__(self, root: str, det_s: float, rand_s: float, side: int) -> None:
        self.root, self.det_s, self.rand_s, self.side = root, det_s, rand_s, side
        self.samples = [(os.path.join(root, f), 0) for f in sorted(os.listdir(root))]

    def __len__(self) -> int:
        return len(self.samples)

    def fetch(self, index: int) -> bytes:
        with open(self.samples[index][0], "rb") as f:
            return f.read()

    @staticmethod
    def _spin(cpu_s: float) -> None:
        # CPU time, not wall time: the work costs the same on a loaded machine, only its wall time moves
        end = time.thread_time() + cpu_s
        while time.thread_time() < end:
            pass

    def prep_deterministic(self, raw: bytes, index: int) -> np.ndarray:
        self._spin(self.det_s)
        return np.full((self.side, self.side, 3), raw[0], dtype=np.uint8)

    def prep_random(self, array: np.ndarray, index: int) -> torch.Tensor:
        self._spin(self.rand_s)
        flip = array[:, ::-1] if np.random.random() < 0.5 else array
        return torch.from_numpy(np.ascontiguousarray(flip)).float()

    def prep(self, raw: bytes, index: int) -> torch.Tensor:
        return self.prep_random(self.prep_deterministic(raw, index), index)

    def prep_identity(self) -> str:
        return f"spin-{self.det_s}-{self.side}"

    def dataset_identity(self) -> str:
        return self.root


def write_data(root: str, items: int, size: int = 4096) -> str:
    """``items`` files of ``size`` bytes (created once)."""
    os.makedirs(root, exist_ok=True)
    for i in range(items):
        path = os.path.join(root, f"{i:05d}.bin")
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write(bytes([i % 256]) * size)
    return root


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--det-ms", type=float, default=3.0)
    p.add_argument("--rand-ms", type=float, default=1.5)
    p.add_argument("--side", type=int, default=64)
    p.add_argument("--step-ms", type=float, default=5.0)
    p.add_argument("--coordinate", default=None)
    p.add_argument("--sample-cache-bytes", type=int, default=0)
    p.add_argument("--measure", type=int, default=0, help="batches to time (0: train until stopped)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument(
        "--sync-dir", default=None, help="coordinated runs: wait for --jobs members, stop on 'stop'"
    )
    p.add_argument("--jobs", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    src = SplitSource(a.data, a.det_ms / 1e3, a.rand_ms / 1e3, a.side)
    store = None
    if a.sample_cache_bytes:
        import memcache

        store = memcache.LocalStore(a.sample_cache_bytes, name=f"remedyjob{os.getpid()}")
    loader = coordl.DataLoader(src, batch_size=a.batch, shuffle=True, num_workers=a.workers, drop_last=True,
                               coordinate=a.coordinate, sample_cache=store)  # fmt: skip
    if a.sync_dir:  # every job a member before any reads (a late joiner waits for the next epoch)
        open(os.path.join(a.sync_dir, f"ready-{os.getpid()}"), "w").close()
        while sum(n.startswith("ready-") for n in os.listdir(a.sync_dir)) < a.jobs:
            time.sleep(0.01)
    done, t0, per_epoch = 0, None, len(loader)
    warmup = a.warmup if store is None else per_epoch  # the first epoch fills the sample cache
    for _ in range(10_000):
        if store is not None and done == warmup:
            t0 = time.perf_counter()  # epochs start with iter(): their starts count, as the model's do
        for _batch in loader:
            time.sleep(a.step_ms / 1e3)
            done += 1
            if store is None and done == warmup:
                t0 = time.perf_counter()
            if a.measure and t0 is not None and done == warmup + a.measure:
                rate = a.measure * a.batch / (time.perf_counter() - t0)
                print(f"samples_per_s={rate:.3f}", flush=True)
                if store is not None:
                    print(f"stats={loader.stats()}", flush=True)
            # coordinated: keep the group's producers at work until every job has measured
            stop = a.sync_dir is None or os.path.exists(os.path.join(a.sync_dir, "stop"))
            if a.measure and done >= warmup + a.measure and stop:
                loader.close()
                return


if __name__ == "__main__":
    main(sys.argv[1:])

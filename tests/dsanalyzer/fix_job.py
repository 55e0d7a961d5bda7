"""A small training job for ``dsanalyzer fix``'s tests: a torch DataLoader over in-memory items whose prep
waits ``--prep-ms`` per item (a sleep: the same on a loaded host as on a quiet one, so more workers give
more items/s whatever else runs), and a step that waits ``--step-ms`` (an emulated accelerator).

python tests/dsanalyzer/fix_job.py --workers 1 --prep-ms 8 --step-ms 10
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset


class SleepyItems(Dataset):
    """``items`` samples of 4 floats; each takes ``prep_s`` to prepare."""

    def __init__(self, items: int, prep_s: float) -> None:
        self.items, self.prep_s = items, prep_s

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.prep_s)
        return torch.full((4,), float(index))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--prep-ms", type=float, default=8.0)
    p.add_argument("--step-ms", type=float, default=10.0)
    p.add_argument("--items", type=int, default=400)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--epochs", type=int, default=50)
    a = p.parse_args()
    data = SleepyItems(a.items, a.prep_ms / 1e3)
    loader = DataLoader(data, batch_size=a.batch, shuffle=True, num_workers=a.workers)
    for _ in range(a.epochs):
        for _batch in loader:
            time.sleep(a.step_ms / 1e3)


if __name__ == "__main__":
    main()

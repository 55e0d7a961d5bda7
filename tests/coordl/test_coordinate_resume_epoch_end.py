"""A coordinated job resumed from a state taken at an epoch's end gets the next epoch, whole (as a plain
loader does), not an empty pass.

Found by the soak (benchmarks/soak, docs/reliability.md "Soak"): a coordinated job killed right after an
epoch and resumed from its ``state_dict()`` of that moment counted a pass with no batch as an epoch;
240 items of two epochs were "lost" in a 4-minute run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import coordl
from coordl.coordinated.job import Group

N, BS = 48, 4


class Items:
    def __len__(self) -> int:
        return N

    def fetch(self, index: int) -> bytes:
        return index.to_bytes(4, "little")

    def prep(self, raw: bytes, index: int) -> torch.Tensor:
        return torch.tensor(int.from_bytes(raw, "little"))


def _loader(directory: Path) -> coordl.DataLoader:
    return coordl.DataLoader(Items(), batch_size=BS, shuffle=True, num_workers=1,
                             coordinate=Group("epoch-end", directory=str(directory), timeout_s=30))  # fmt: skip


def _ids(batches: list) -> list[int]:
    return [int(i) for b in batches for i in b]


@pytest.mark.timeout(120)
def test_state_at_an_epochs_end_resumes_with_the_next_epoch(tmp_path: Path) -> None:
    dl = _loader(tmp_path / "a")
    first = list(dl)
    state = dl.state_dict()  # the epoch's last batch was handed out
    second = list(dl)  # what the uninterrupted job gets next
    dl.close()
    assert len(first) == len(second) == N // BS

    resumed = _loader(tmp_path / "b")  # a new process would do the same (the group started afresh)
    resumed.load_state_dict(state)
    again = list(resumed)
    resumed.close()
    assert len(again) == N // BS  # not an empty pass
    assert _ids(again) == _ids(second)  # the next epoch, in the group's order for it
    assert sorted(_ids(again)) == list(range(N))

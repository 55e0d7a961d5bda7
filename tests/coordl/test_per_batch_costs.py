"""What issue 59 moved from per item to per batch keeps every result: small samples stacked a group at a
time give torch's batches (and torch's error, or its fallback, when a sample does not fit mid-group);
the workers derive each item's seed from the epoch seed the batch's first index carries, exactly the
seeds the main process used to attach to every index; a read under the pace's limit never reads the
thread's CPU clock."""

from __future__ import annotations

import pickle

import pytest
import torch

import coordl
from coordl.fetch.pace import BLOCKED_LIMIT_S, ReadPace
from coordl.resume.order import SeededIndex, batch_seeds, item_seed
from coordl.ring.stacker import GROUP_BYTES
from tests.coordl.ldr_sources import MemorySource
from tests.coordl.ldr_sources import TorchReference as Reference


class SmallSamples(MemorySource):
    """``(tensor of `floats` float32, label)``; item ``odd`` differs as ``how`` says."""

    def __init__(self, n: int, floats: int, odd: int = -1, how: str = "") -> None:
        super().__init__(n)
        self.floats, self.odd, self.how = floats, odd, how

    def prep(self, raw: bytes, index: int):
        x = torch.arange(self.floats, dtype=torch.float32) + index
        if index == self.odd and self.how == "dtype":
            x = x.to(torch.float64)
        if index == self.odd and self.how == "grad":
            x.requires_grad_(True)
        return x, index


def _same(ours: list, theirs: list) -> None:
    assert len(ours) == len(theirs)
    for (x, y), (u, v) in zip(ours, theirs, strict=True):
        assert x.dtype == u.dtype and torch.equal(x, u) and torch.equal(y, v)


@pytest.mark.parametrize("floats", [4, 1000, GROUP_BYTES // 4])  # groups of 4096 / 65 samples / one sample
def test_small_samples_stacked_in_groups_give_torchs_batches(floats: int) -> None:
    src = SmallSamples(300, floats)
    kw = dict(batch_size=100, num_workers=2, persistent_workers=True)
    theirs = [(x.clone(), y.clone()) for x, y in torch.utils.data.DataLoader(Reference(src), **kw)]
    with coordl.DataLoader(src, **kw) as ours:
        for _ in range(2):
            _same([(x.clone(), y.clone()) for x, y in ours], theirs)
        stats = ours.stats()
    assert stats["ring_stacked"] > 0 and stats["ring_fallbacks"] == 0


@pytest.mark.parametrize("how", ["dtype", "grad"])
def test_a_sample_unlike_its_group_gives_what_torchs_collate_gives(how: str) -> None:
    # Item 150 is mid-group of its worker's second batch (items 100-199): torch's collate decides.
    src = SmallSamples(200, 4, odd=150, how=how)
    kw = dict(batch_size=100, num_workers=2, persistent_workers=True)
    try:
        theirs: list | BaseException = [
            (x.detach().clone(), y.clone()) for x, y in torch.utils.data.DataLoader(Reference(src), **kw)
        ]
    except Exception as error:  # noqa: BLE001 - then coordl must raise the same
        theirs = error
    with coordl.DataLoader(src, **kw) as ours:
        if isinstance(theirs, BaseException):
            with pytest.raises(type(theirs)):
                list(ours)
        else:
            _same([(x.detach().clone(), y.clone()) for x, y in ours], theirs)


def test_workers_derive_the_seeds_the_main_process_used_to_attach() -> None:
    epoch_seed = 1234567890123
    batch = [SeededIndex(7, item_seed(epoch_seed, 7), epoch_seed=epoch_seed), 3, 11]
    assert batch_seeds(batch) == [item_seed(epoch_seed, i) for i in (7, 3, 11)]
    first = pickle.loads(pickle.dumps(batch[0]))  # as it reaches a worker
    assert (int(first), first.seed, first.batch, first.epoch_seed) == (7, batch[0].seed, None, epoch_seed)
    assert batch_seeds([SeededIndex(5, 99), SeededIndex(6, 98)]) == [99, 98]  # each carrying its own
    assert batch_seeds([1, 2]) == [None, None]


def test_per_item_draws_follow_the_item_not_the_worker_or_the_batch() -> None:
    class Augmented(MemorySource):
        def prep(self, raw: bytes, index: int):
            return torch.cat([super().prep(raw, index).float()[:1], torch.rand(2)])

    def draws(workers: int, batch_size: int) -> dict[int, torch.Tensor]:
        with coordl.DataLoader(Augmented(40), batch_size=batch_size, shuffle=True, num_workers=workers,
                               generator=torch.Generator().manual_seed(3)) as dl:  # fmt: skip
            return {int(row[0]): row[1:].clone() for batch in dl for row in batch}

    base = draws(0, 8)
    assert len(base) == 40
    for other in (draws(2, 8), draws(2, 5)):  # the same epoch seed: the same draws for every item
        assert all(torch.equal(base[i], other[i]) for i in base)


def test_a_fast_read_never_reads_the_cpu_clock() -> None:
    clock = {"wall": 0.0, "cpu_reads": 0}

    def cpu() -> float:
        clock["cpu_reads"] += 1
        return 0.0

    pace = ReadPace(wall=lambda: clock["wall"], cpu=cpu)
    pace.slow = False  # fast storage, as after a probe found it

    def read(block_s: float) -> bytes:
        clock["wall"] += block_s
        return b"x"

    for _ in range(20):
        pace.timed_call(read, BLOCKED_LIMIT_S / 10)
    assert clock["cpu_reads"] == 0 and not pace.slow
    pace.timed_call(read, 1.0)  # a long read: counted whole, the next ones timed on both clocks
    assert clock["cpu_reads"] == 0
    for _ in range(8):
        pace.timed_call(read, 1.0)
    assert clock["cpu_reads"] == 2 * 8 and pace.slow

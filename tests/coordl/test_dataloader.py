"""coordl.DataLoader gives the batches torch's DataLoader gives, argument by argument, on the same data."""

from __future__ import annotations

import gc
import os

import pytest
import torch
from torch.utils.data import BatchSampler, SequentialSampler, SubsetRandomSampler

import coordl
from coordl.errors import CoordlTimeoutError, CorruptItemError
from tests.coordl.ldr_sources import MemorySource, PidSource, SlowSource, TorchReference


def both(num_workers: int = 0, n: int = 23, seed: int | None = None, **kwargs):
    """A coordl loader and a torch loader over the same items with the same arguments."""
    src = MemorySource(n)
    gens = [torch.Generator().manual_seed(seed) for _ in range(2)] if seed is not None else [None, None]
    ours = coordl.DataLoader(src, num_workers=num_workers, generator=gens[0], **kwargs)
    theirs = torch.utils.data.DataLoader(
        TorchReference(src), num_workers=num_workers, generator=gens[1], **kwargs
    )
    return ours, theirs


def as_lists(loader) -> list:
    return [b.tolist() if isinstance(b, torch.Tensor) else repr(b) for b in loader]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_same_batches_same_order(num_workers: int, shuffle: bool) -> None:
    ours, theirs = both(num_workers, batch_size=4, shuffle=shuffle, seed=7)
    with ours:
        for _ in range(2):  # the second epoch draws the next permutation from the generator in both
            assert as_lists(ours) == as_lists(theirs)


@pytest.mark.parametrize("drop_last", [False, True])
def test_len_and_drop_last(drop_last: bool) -> None:
    ours, theirs = both(batch_size=5, drop_last=drop_last)
    with ours:
        assert len(ours) == len(theirs) == (4 if drop_last else 5)
        got = as_lists(ours)
        assert len(got) == len(ours)
        assert got == as_lists(theirs)


def test_sampler_and_batch_sampler() -> None:
    idx = list(range(0, 23, 2))
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    src = MemorySource(23)
    with coordl.DataLoader(src, batch_size=3, sampler=SubsetRandomSampler(idx, generator=g1)) as ours:
        theirs = torch.utils.data.DataLoader(
            TorchReference(src), batch_size=3, sampler=SubsetRandomSampler(idx, generator=g2)
        )
        assert as_lists(ours) == as_lists(theirs)
    bs = BatchSampler(SequentialSampler(range(23)), batch_size=6, drop_last=True)
    with coordl.DataLoader(src, batch_sampler=bs) as ours:
        theirs = torch.utils.data.DataLoader(TorchReference(src), batch_sampler=bs)
        assert len(ours) == len(theirs) == 3
        assert as_lists(ours) == as_lists(theirs)


def test_batch_size_none_and_collate_fn() -> None:
    ours, theirs = both(batch_size=None)
    with ours:
        assert as_lists(ours) == as_lists(theirs)

    def pairs(batch):
        return [tuple(t.tolist()) for t in batch]

    ours, theirs = both(batch_size=4, collate_fn=pairs)
    with ours:
        assert list(ours) == list(theirs)


def _record_worker(worker_id: int) -> None:
    info = torch.utils.data.get_worker_info()
    path = os.environ["LDR_INIT_DIR"]
    with open(os.path.join(path, f"{worker_id}-{info.num_workers}"), "w") as f:
        f.write(str(os.getpid()))


def test_worker_init_fn_called_once_per_worker(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LDR_INIT_DIR", str(tmp_path))
    with coordl.DataLoader(
        MemorySource(10), batch_size=2, num_workers=2, worker_init_fn=_record_worker
    ) as dl:
        list(dl)
    assert sorted(os.listdir(tmp_path)) == ["0-2", "1-2"]


@pytest.mark.parametrize("persistent", [False, True])
def test_persistent_workers_keep_their_processes(persistent: bool) -> None:
    src = PidSource(12)
    with coordl.DataLoader(src, batch_size=3, num_workers=2, persistent_workers=persistent) as dl:
        pids = [{int(p) for b in dl for p in b[:, 1]} for _ in range(2)]
    assert len(pids[0]) == 2
    assert (pids[0] == pids[1]) is persistent


class FreezeCountSource(MemorySource):
    """Each sample carries how many objects the garbage collector holds frozen where it was made."""

    def prep(self, raw: bytes, index: int) -> torch.Tensor:
        return torch.tensor([index, gc.get_freeze_count()])


@pytest.mark.parametrize("frozen_by_the_program", [False, True])
def test_forked_workers_inherit_the_main_processs_objects_frozen(frozen_by_the_program: bool) -> None:
    # Frozen objects are never collected in a worker, so its collections do not copy the inherited heap.
    if frozen_by_the_program:
        gc.freeze()
    try:
        before = gc.get_freeze_count()
        with coordl.DataLoader(FreezeCountSource(8), batch_size=2, num_workers=2) as dl:
            counts = [int(c) for b in dl for c in b[:, 1]]
            # The main process's own state is as it was: nothing frozen, or the program's freeze kept
            # (frozen objects that are freed meanwhile leave the count, so it may shrink a little).
            after = gc.get_freeze_count()
            assert after > before // 2 if frozen_by_the_program else after == 0
        assert min(counts) > 0
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_early_break_and_reiteration(num_workers: int) -> None:
    ours, theirs = both(num_workers, batch_size=3, shuffle=True, seed=11)
    with ours:
        for loader in (ours, theirs):
            for i, _ in enumerate(loader):
                if i == 1:
                    break
        assert as_lists(ours) == as_lists(theirs)
        assert [e["complete"] for e in ours.epoch_stats()] == [False, True]


def test_timeout_raises_naming_the_option() -> None:
    dl = coordl.DataLoader(SlowSource(4), batch_size=1, num_workers=1, timeout=0.3)
    with dl, pytest.raises(CoordlTimeoutError, match="timeout="):
        next(iter(dl))


def test_prefetch_factor_and_pin_memory_pass_through() -> None:
    ours, theirs = both(2, batch_size=4, prefetch_factor=3, pin_memory=False)
    with ours:
        assert ours.prefetch_factor == 3
        assert as_lists(ours) == as_lists(theirs)


def test_torch_attributes_visible() -> None:
    with coordl.DataLoader(MemorySource(10), batch_size=4, drop_last=True) as dl:
        assert dl.batch_size == 4 and dl.drop_last is True and dl.num_workers == 0
        assert isinstance(dl.sampler, SequentialSampler)


def test_iterable_dataset_passes_through() -> None:
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(7))

    with coordl.DataLoader(Stream(), batch_size=3) as dl:
        assert [b.tolist() for b in dl] == [[0, 1, 2], [3, 4, 5], [6]]
    with pytest.raises(ValueError, match="cache_bytes"):
        coordl.DataLoader(Stream(), cache_bytes=1000)


def test_plain_torch_dataset_works_as_one_stage() -> None:
    src = MemorySource(9)
    with coordl.DataLoader(TorchReference(src), batch_size=4) as dl:
        assert as_lists(dl) == as_lists(torch.utils.data.DataLoader(TorchReference(src), batch_size=4))


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"cache_bytes": -1}, "cache_bytes"),
        ({"cache_bytes": 1.5}, "cache_bytes"),
        ({"on_error": "ignore"}, "on_error"),
        ({"on_error": "skip", "batch_size": None}, "on_error"),
        ({"timeout": -1}, "timeout"),
        ({"sample_cache": object()}, "sample_cache"),
    ],
)
def test_bad_options_name_the_option(kwargs: dict, option: str) -> None:
    with pytest.raises(ValueError, match=option):
        coordl.DataLoader(MemorySource(4), **kwargs)


def test_stats_keys_without_cache() -> None:
    with coordl.DataLoader(MemorySource(10), batch_size=5) as dl:
        list(dl)
        s = dl.stats()
    for key in (
        "cache_hits",
        "cache_misses",
        "cached_items",
        "cached_bytes",
        "storage_bytes_read",
        "skipped_items",
    ):
        assert key in s
    assert s["storage_bytes_read"] == 10 * 64 and s["cache_hits"] == 0
    assert dl.stats() == s  # still readable after close


def test_closed_loader_refuses_iteration() -> None:
    dl = coordl.DataLoader(MemorySource(4))
    dl.close()
    with pytest.raises(RuntimeError, match="closed"):
        iter(dl)


def test_an_error_from_a_worker_leaves_no_cycle_keeping_the_workers() -> None:
    """torch re-raises a worker's exception from frames that hold it and the iterator: a cycle that
    kept the iterator's worker processes alive until some later collection, where shutting them down
    stalled the program (seen in CI: minutes inside an unrelated matplotlib call)."""
    import gc

    import torch.utils.data.dataloader as tdl

    gc.collect()
    gc.disable()
    try:
        dl = coordl.DataLoader(MemorySource(8, bad=(0,)), batch_size=2, num_workers=2, batch_ring=False)
        with pytest.raises(CorruptItemError):
            next(iter(dl))
        alive = [o for o in gc.get_objects() if isinstance(o, tdl._MultiProcessingDataLoaderIter)]
        assert alive == []
        dl.close()
    finally:
        gc.enable()

"""coordl.DataLoader as the frameworks see it, in one process: torch's face, Lightning's rebuild,
Accelerate's prepare, the warning when nothing shards it. (The 2-process jobs: test_lightning.py,
test_accelerate.py.)"""

from __future__ import annotations

import gc
import os
import warnings
import weakref

import pytest
import torch
import torch.utils.data as tud

import coordl

from .jobdata import NUM_ITEMS, Items, make_loader


def batches(loader) -> list[list[int]]:
    return [[int(i) for i in b] for b in loader]


def test_it_is_a_torch_dataloader_with_torchs_attributes_for_the_users_arguments() -> None:
    def collate(samples):
        return torch.stack(samples)

    ds = Items()
    with coordl.DataLoader(
        ds, batch_size=8, shuffle=True, num_workers=1, collate_fn=collate, cache_bytes=1 << 20
    ) as dl:
        assert isinstance(dl, tud.DataLoader)
        assert dl.collate_fn is collate  # with workers too: the batch ring stays inside
        assert isinstance(dl.sampler, tud.RandomSampler) and isinstance(dl.batch_sampler, tud.BatchSampler)
        assert dl.dataset.dataset is ds and len(dl.dataset) == NUM_ITEMS and dl.dataset.n == NUM_ITEMS
        assert int(dl.dataset[5]) == 5  # read through the loader's tiers
        for name, value in (("batch_size", 4), ("sampler", None), ("dataset", ds), ("drop_last", True)):
            with pytest.raises(ValueError, match=f"{name} attribute should not be set"):
                setattr(dl, name, value)
    assert coordl.DataLoader[int] is not None  # generic, as torch's
    with pytest.raises(ValueError, match="sampler option is mutually exclusive with shuffle"):
        coordl.DataLoader(ds, shuffle=True, sampler=tud.SequentialSampler(ds))


def lightning_rebuild(loader, rank: int):
    from lightning.pytorch.utilities.data import _update_dataloader

    return _update_dataloader(
        loader, tud.DistributedSampler(loader.dataset, num_replicas=2, rank=rank, seed=0)
    )


def made_in_a_hook(kind: str, **overrides):
    """What Lightning does around a ``train_dataloader`` hook: wrap __init__ to record its arguments."""
    from lightning.fabric.utilities.data import _replace_dunder_methods

    with _replace_dunder_methods(tud.DataLoader, "dataset"), _replace_dunder_methods(tud.BatchSampler):
        return make_loader(kind, **overrides)


def test_lightning_rebuilds_it_as_a_coordl_loader_sharded_like_torchs() -> None:
    pytest.importorskip("lightning")
    per_rank = {}
    for rank in (0, 1):
        ref = lightning_rebuild(made_in_a_hook("torch", num_workers=0), rank)
        original = made_in_a_hook("coordl", num_workers=0, on_error="skip", fetch_ahead=2, batch_ring="copy")
        dl = lightning_rebuild(original, rank)
        assert type(dl) is coordl.DataLoader and isinstance(dl.sampler, tud.DistributedSampler)
        assert (dl.cache_bytes, dl.on_error, dl.fetch_ahead, dl.batch_ring) == (1 << 20, "skip", 2, "copy")
        dl.sampler.set_epoch(0), ref.sampler.set_epoch(0)
        got = batches(dl)
        assert got == batches(ref)  # the same items, in the same order, as torch's loader rebuilt alike
        per_rank[rank] = {i for b in got for i in b}
        assert dl.epoch_stats()[0]["cache_misses"] == len(per_rank[rank])
        assert {i for b in batches(dl) for i in b} == per_rank[rank] and dl.epoch_stats()[1][
            "hit_ratio"
        ] == 1.0
        # The rebuilt loader took over the dropped one's fetch side (Lightning's sampler keeps its view
        # alive anyway): one cache, one counter table. What was the dropped loader's alone goes with it.
        assert (
            dl.dataset is original.dataset
            and dl._chain is original._chain
            and dl._counters is original._counters
        )
        own = [original._inner._skips.segment.path]  # on_error="skip": the dropped loader's own skip log
        gone = weakref.ref(original)
        del original
        gc.collect()
        assert gone() is None and not any(os.path.exists(p) for p in own)
        shared = [dl._counters._segment.path, *dl._chain.minio.paths]
        dl.close()
        assert not any(os.path.exists(p) for p in shared)
    assert not per_rank[0] & per_rank[1] and per_rank[0] | per_rank[1] == set(range(NUM_ITEMS))


def test_accelerate_prepare_keeps_the_tiers_and_the_users_collate() -> None:
    pytest.importorskip("accelerate")
    from accelerate.data_loader import prepare_data_loader

    def collate(samples):
        return torch.stack(samples)

    per_rank = {}
    for rank in (0, 1):
        ref = prepare_data_loader(
            make_loader("torch", collate_fn=collate), num_processes=2, process_index=rank
        )
        with make_loader("coordl", collate_fn=collate) as loader:
            shard = prepare_data_loader(loader, num_processes=2, process_index=rank)
            assert shard.collate_fn is collate and type(shard.dataset).__name__ == "DatasetView"
            got = batches(shard)
            assert got == batches(ref)  # the same items in the same order as torch's loader prepared alike
            per_rank[rank] = {i for b in got for i in b}
    assert not per_rank[0] & per_rank[1] and per_rank[0] | per_rank[1] == set(range(NUM_ITEMS))
    with make_loader(
        "coordl", shuffle=False
    ) as loader:  # the reads of Accelerate's loader go through the cache
        shard = prepare_data_loader(loader, num_processes=2, process_index=0)
        for epoch in (0, 1):
            before = loader.stats()
            assert sum(len(b) for b in shard) == NUM_ITEMS // 2
            hits, misses = (loader.stats()[k] - before[k] for k in ("cache_hits", "cache_misses"))
            assert (hits, misses) == ((0, NUM_ITEMS // 2) if epoch == 0 else (NUM_ITEMS // 2, 0))


def _unsharded_rank(rank: int, port: int, results) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        out = {}
        for name, kwargs in (
            ("default", {}),
            ("distributed", {"sampler": tud.DistributedSampler(Items(), num_replicas=2, rank=rank)}),
            ("explicit", {"sampler": tud.SequentialSampler(Items())}),
        ):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with coordl.DataLoader(Items(), batch_size=64, **kwargs) as dl:
                    n = sum(len(b) for b in dl) + sum(len(b) for b in dl)  # two epochs
            out[name] = (
                n,
                [str(w.message) for w in caught if "coordl.DataLoader is iterated" in str(w.message)],
            )
        results[rank] = out
    finally:
        dist.destroy_process_group()


def test_an_unsharded_loader_in_a_process_group_warns_once_naming_the_fix() -> None:
    import torch.multiprocessing as mp

    port = 29000 + os.getpid() % 1000
    with mp.Manager() as manager:
        results = manager.dict()
        mp.start_processes(_unsharded_rank, args=(port, results), nprocs=2, join=True, start_method="fork")
        results = dict(results)
    for rank in (0, 1):
        n, warned = results[rank]["default"]
        assert n == 2 * NUM_ITEMS and len(warned) == 1  # once, not once per epoch
        assert f"rank {rank} of a process group of 2" in warned[0] and "DistributedSampler" in warned[0]
        assert results[rank]["distributed"] == (NUM_ITEMS, [])
        assert results[rank]["explicit"] == (2 * NUM_ITEMS, [])  # a sampler the user chose is taken as meant
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # outside a process group: nothing to say
        with coordl.DataLoader(Items(), batch_size=64) as dl:
            assert sum(len(b) for b in dl) == NUM_ITEMS


def test_ignite_deterministic_engine_rebuilds_it_as_a_coordl_loader() -> None:
    """Ignite's DeterministicEngine replaces a torch DataLoader's batch sampler by rebuilding the loader
    from its instance attributes (``type(loader)(**vars)``): it must get a coordl loader back, same batches."""
    pytest.importorskip("ignite")
    from ignite.engine import DeterministicEngine, Events

    def run(loader) -> tuple[list[list[int]], object]:
        seen: list[list[int]] = []
        engine = DeterministicEngine(lambda engine, batch: seen.append([int(i) for i in batch]))
        used = {}
        engine.add_event_handler(
            Events.EPOCH_COMPLETED, lambda e: used.setdefault("loader", e.state.dataloader)
        )
        engine.run(loader, max_epochs=2)
        return seen, used["loader"]

    theirs, _ = run(make_loader("torch", num_workers=0))
    with make_loader("coordl", num_workers=0) as loader:
        ours, used = run(loader)
        assert ours == theirs
        assert type(used) is coordl.DataLoader and used is not loader
        assert (
            used.cache_bytes == loader.cache_bytes and used.dataset is loader.dataset
        )  # took over its fetch side
        assert used.epoch_stats()[1]["hit_ratio"] == 1.0
        used.close()


def _resume_rank(rank: int, port: int, results) -> None:
    """Plain DDP, no framework: each rank saves its loader's state_dict mid-epoch and a new loader resumes."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)

    def loader():
        sampler = tud.DistributedSampler(Items(), num_replicas=2, rank=rank, seed=0)
        return coordl.DataLoader(Items(), batch_size=16, sampler=sampler, num_workers=1, cache_bytes=1 << 20)

    try:
        with loader() as whole:
            whole.sampler.set_epoch(1)
            expected = batches(whole)
        with loader() as first:
            first.sampler.set_epoch(1)
            it = iter(first)
            done = [[int(i) for i in next(it)] for _ in range(3)]
            state = first.state_dict()  # what the training script saves with its checkpoint, per rank
        with loader() as second:
            second.load_state_dict(state)  # the sampler's epoch comes back with it
            rest = batches(second)
        results[rank] = (expected, done, rest)
    finally:
        dist.destroy_process_group()


def test_plain_ddp_resumes_each_rank_from_its_state_dict() -> None:
    import torch.multiprocessing as mp

    port = 29500 + os.getpid() % 1000
    with mp.Manager() as manager:
        results = manager.dict()
        mp.start_processes(_resume_rank, args=(port, results), nprocs=2, join=True, start_method="fork")
        results = dict(results)
    for rank in (0, 1):
        expected, done, rest = results[rank]
        assert done + rest == expected and len(rest) == len(expected) - 3


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("even_batches", [True, False])
def test_accelerate_uneven_split_is_torchs(drop_last: bool, even_batches: bool) -> None:
    """250 items, batches of 16 over 2 ranks: the padded or short last batches are exactly torch's."""
    pytest.importorskip("accelerate")
    from accelerate.data_loader import prepare_data_loader

    def prepared(loader, rank):
        return prepare_data_loader(loader, num_processes=2, process_index=rank, even_batches=even_batches)

    args = {"batch_size": 16, "shuffle": False, "drop_last": drop_last}
    for rank in (0, 1):
        theirs = batches(prepared(tud.DataLoader(Items(250), **args), rank))
        with coordl.DataLoader(Items(250), cache_bytes=1 << 20, **args) as loader:
            assert batches(prepared(loader, rank)) == theirs


@pytest.mark.parametrize("drop_last", [False, True])
def test_lightning_uneven_split_is_torchs(drop_last: bool) -> None:
    pytest.importorskip("lightning")
    for rank in (0, 1):
        ref = lightning_rebuild(
            made_in_a_hook("torch", num_workers=0, drop_last=drop_last, batch_size=20), rank
        )
        dl = lightning_rebuild(
            made_in_a_hook("coordl", num_workers=0, drop_last=drop_last, batch_size=20), rank
        )
        with dl:
            assert len(dl) == len(ref) and batches(dl) == batches(ref)

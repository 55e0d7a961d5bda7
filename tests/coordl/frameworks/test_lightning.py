"""Lightning DDP (2 CPU ranks, gloo) shards a coordl.DataLoader exactly as torch's, keeps its cache and
resumes it from a mid-epoch checkpoint. Each case starts the real Trainer (lightning_job.py)."""

from __future__ import annotations

import pytest

from .jobdata import NUM_ITEMS
from .runjobs import assert_sharded, items, lightning

pytest.importorskip("lightning")
pytestmark = pytest.mark.slow  # each Trainer.fit of 2 ranks: 8-15 s here


@pytest.fixture(scope="module")
def coordl_ranks(tmp_path_factory) -> list:
    """The plain 2-epoch DDP run with coordl's loader: what the sharding test checks and the resume test's
    whole run (the same command: one Trainer run for both)."""
    return lightning(tmp_path_factory.mktemp("lightning") / "coordl", "--loader", "coordl")


@pytest.fixture(scope="module")
def torch_ranks(tmp_path_factory) -> list:
    """The same run with torch's own loader: the items each rank must see (DistributedSampler's shards depend on
    its seed and epoch, not on the strategy that started the ranks: the ddp_spawn test compares against it too)."""
    return lightning(tmp_path_factory.mktemp("lightning") / "torch", "--loader", "torch")


def test_sharded_as_torchs_with_the_cache_shared_by_the_node(coordl_ranks, torch_ranks) -> None:
    ranks = coordl_ranks
    assert_sharded(torch_ranks, NUM_ITEMS, epochs=2)
    assert_sharded(ranks, NUM_ITEMS, epochs=2)
    for ours, theirs in zip(ranks, torch_ranks, strict=True):
        assert (
            ours["seen"] == theirs["seen"]
        )  # the same items in the same order, both epochs (set_epoch applied)
        assert set(items(ours, 0)) != set(items(ours, 1))  # reshuffled across ranks each epoch
        assert (
            ours["loader_class"] == "coordl.dataloader.DataLoader"
            and ours["sampler_class"] == "DistributedSampler"
        )
        first, second = ours["epoch_stats"]
        assert first["cache_misses"] == NUM_ITEMS // 2 and first["cache_hits"] == 0
        # Epoch 2 hits every item although each rank now reads items the other one fetched: one cache per node.
        assert second["hit_ratio"] == 1.0 and second["cache_hits"] == NUM_ITEMS // 2
        assert not ours["warnings"]
    assert ranks[0]["minio_paths"] == ranks[1]["minio_paths"] and ranks[0]["capacity_bytes"] == 1 << 20


def test_a_mid_epoch_checkpoint_resumes_exactly(tmp_path, coordl_ranks) -> None:
    full = coordl_ranks
    ckpt = tmp_path / "mid.ckpt"
    # 8 batches per rank and epoch: global step 11 is batch 3 of epoch 1 (the second epoch).
    cut = lightning(tmp_path / "cut", "--loader", "coordl", "--save-at", "11", "--ckpt", str(ckpt))
    resumed = lightning(tmp_path / "resumed", "--loader", "coordl", "--resume", str(ckpt))
    for whole, before, after in zip(full, cut, resumed, strict=True):
        assert items(before, 1) == items(whole, 1)[:48]
        assert list(after["seen"]) == ["1"] and items(after, 1) == items(whole, 1)[48:]  # exactly the rest
        assert after["steps"]["1"] == [11, 12, 13, 14, 15]


def test_ddp_spawn_shards_it_too(tmp_path, torch_ranks) -> None:
    ranks = lightning(tmp_path / "coordl", "--loader", "coordl", "--strategy", "ddp_spawn")
    assert_sharded(ranks, NUM_ITEMS, epochs=2)
    for ours, theirs in zip(ranks, torch_ranks, strict=True):
        assert ours["seen"] == theirs["seen"]
        assert ours["epoch_stats"][1]["hit_ratio"] == 1.0

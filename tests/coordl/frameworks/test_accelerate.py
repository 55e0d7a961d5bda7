"""Accelerate (``accelerator.prepare`` under torchrun, 2 CPU ranks, gloo) shards a coordl.DataLoader
exactly as torch's, its rebuilt loader reads through coordl's cache with the user's collate_fn, and
save_state/load_state resume it mid-epoch. Each case starts the real job (accelerate_job.py)."""

from __future__ import annotations

import os

import pytest

from .jobdata import NUM_ITEMS
from .runjobs import accelerate, assert_sharded, items

pytest.importorskip("accelerate")
pytestmark = pytest.mark.slow  # each torchrun of 2 ranks: 10-20 s here


def test_sharded_as_torchs_through_the_cache(tmp_path) -> None:
    torch_ranks = accelerate(tmp_path / "torch", "--loader", "torch")
    ranks = accelerate(tmp_path / "coordl", "--loader", "coordl")
    assert_sharded(torch_ranks, NUM_ITEMS, epochs=2)
    assert_sharded(ranks, NUM_ITEMS, epochs=2)
    for ours, theirs in zip(ranks, torch_ranks, strict=True):
        assert ours["seen"] == theirs["seen"]
        assert ours["collate_fn"] == "default_collate" and ours["prepared_dataset"] == "DatasetView"
        first, second = ours["epoch_cache"]
        assert first["cache_hits"] == 0 and first["cache_misses"] == NUM_ITEMS // 2
        assert second["hit_ratio"] == 1.0 and second["cache_hits"] == NUM_ITEMS // 2
    assert ranks[0]["minio_paths"] == ranks[1]["minio_paths"]


# torch's case is the control (the job and Accelerate resume exactly with torch's own loader): by hand only,
# COORDL_CONTROLS=1 (three torchruns, ~60 s of CI's parallel phase, and none of coordl's code)
CONTROL = pytest.mark.skipif(
    not os.environ.get("COORDL_CONTROLS"), reason="the control, by hand: COORDL_CONTROLS=1"
)


@pytest.mark.parametrize("kind", [pytest.param("torch", marks=CONTROL), "coordl"])
def test_save_state_resumes_exactly_with_a_stateful_loader(tmp_path, kind: str) -> None:
    pytest.importorskip("torchdata")
    full = accelerate(tmp_path / "full", "--loader", kind, "--stateful")
    state = tmp_path / "state"
    cut = accelerate(
        tmp_path / "cut", "--loader", kind, "--stateful", "--save-at", "11", "--state", str(state)
    )
    resumed = accelerate(tmp_path / "resumed", "--loader", kind, "--stateful", "--resume", str(state))
    assert_sharded(full, NUM_ITEMS, epochs=2)
    for whole, before, after in zip(full, cut, resumed, strict=True):
        assert items(before, 1) == items(whole, 1)[:48]
        assert list(after["seen"]) == ["1"] and items(after, 1) == items(whole, 1)[48:]

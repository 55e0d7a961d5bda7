"""A worker that dies raises WorkerDiedError naming the item; corrupt items name their file; skip counts."""

from __future__ import annotations

import logging

import pytest

import coordl
from coordl.errors import CorruptItemError, WorkerDiedError
from tests.coordl.ldr_sources import FileSource, MemorySource, write_files


@pytest.mark.timeout(60)
@pytest.mark.parametrize("persistent", [False, True])
def test_sigkilled_worker_names_its_item(persistent: bool) -> None:
    src = MemorySource(40, kill=13)
    with coordl.DataLoader(src, batch_size=4, num_workers=2, persistent_workers=persistent) as dl:
        with pytest.raises(WorkerDiedError) as info:
            list(dl)
        msg = str(info.value)
        assert "mem://item-13.bin" in msg and "SIGKILL" in msg and "worker pid" in msg
        src.kill = None  # the loader recovers: the next epoch starts fresh workers
        assert sum(len(b) for b in dl) == 40


def test_corrupt_file_error_names_the_file(tmp_path) -> None:
    root = write_files(tmp_path / "items", 12, bad=(5,))
    for num_workers in (0, 2):
        dl = coordl.DataLoader(FileSource(root), batch_size=4, num_workers=num_workers)
        with dl, pytest.raises(CorruptItemError, match=r"items/5\.bin"):
            list(dl)


def test_skip_policy_drops_logs_and_counts(tmp_path, caplog) -> None:
    root = write_files(tmp_path / "items", 12, bad=(5, 6, 7, 10))
    with coordl.DataLoader(FileSource(root), batch_size=4, on_error="skip", cache_bytes=1 << 16) as dl:
        with caplog.at_level(logging.WARNING, logger="coordl"):
            batches = [b[:, 0].tolist() for b in dl]
            list(dl)
        s = dl.stats()
    assert batches == [[0, 1, 2, 3], [4], [8, 9, 11]]  # no zero tensors stand in for the bad items
    assert s["skipped_items"] == 8 and s["items_loaded"] == 16
    logged = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert len(logged) == 4 and any("items/5.bin" in m for m in logged)  # once per item, not per epoch


def test_all_skipped_batch_is_dropped() -> None:
    with coordl.DataLoader(
        MemorySource(8, bad=(4, 5, 6, 7)), batch_size=4, num_workers=2, on_error="skip"
    ) as dl:
        for _ in range(2):  # new worker processes each epoch
            assert [b[:, 0].tolist() for b in dl] == [[0, 1, 2, 3]]
        assert dl.stats()["skipped_items"] == 8
        logged = dl._torch.dataset._skips.segment.array("u1", 0, 8)  # the shared "already logged" flags
        assert logged.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]


def test_worker_exception_keeps_its_type() -> None:
    class Boom(MemorySource):
        def prep(self, raw, index):
            if index == 3:
                raise KeyError("no label for item 3")
            return super().prep(raw, index)

    dl = coordl.DataLoader(Boom(8), batch_size=2, num_workers=2)
    with dl, pytest.raises(KeyError, match="item 3"):
        list(dl)


def test_more_workers_than_constructed_with_still_load(tmp_path):
    # dsanalyzer reruns a loader with a larger num_workers to measure prep scaling.
    from coordl import DataLoader
    from tests.coordl.ldr_sources import MemorySource

    loader = DataLoader(MemorySource(24), batch_size=4, num_workers=1)
    loader.num_workers = 3
    assert sum(len(b) for b in loader) == 24
    loader.close()

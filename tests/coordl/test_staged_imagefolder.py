"""ImageFolder(src, stage_dir=...): loader.stats() counts staging done in every worker."""

from __future__ import annotations

from pathlib import Path

import coordl
from coordl.synth import make_dataset


def test_remote_bytes_are_counted_across_workers_and_epoch_two_is_local(tmp_path):
    remote = make_dataset(tmp_path / "remote", n=16, classes=2, width=64, height=48, seed=0)
    total = sum(p.stat().st_size for p in Path(remote).rglob("*.jpg"))
    ds = coordl.ImageFolder(str(remote), stage_dir=str(tmp_path / "local"),
                            transform=coordl.transforms.eval_transform(32, resize=36))  # fmt: skip
    with coordl.DataLoader(ds, batch_size=4, num_workers=2) as loader:
        for _ in loader:
            pass
        first = loader.stats()
        assert first["remote_bytes_read"] == total
        assert first["staged_items"] == 16 and first["staged_bytes"] == total
        for _ in loader:
            pass
        assert loader.stats()["remote_bytes_read"] == total  # epoch 2 read only local copies

"""When the disk budget or the disk itself is full, staging stops and reads keep working from the remote."""

from __future__ import annotations

import os

from nfs_cache import StagedSource


def _read_everything(staged: StagedSource, files: dict[str, bytes]) -> None:
    for rel in staged.list_files():
        assert staged.read(rel) == files[rel]


def test_budget_caps_staged_bytes(dataset, tmp_path):
    root, files = dataset
    budget = 50_000
    with StagedSource(root, tmp_path / "stage", budget_bytes=budget) as staged:
        _read_everything(staged, files)
        stats = staged.stats()
        assert 0 < stats["staged_bytes"] <= budget
        assert stats["staged_items"] < len(files)
        assert "budget" in staged.staging_stopped
        _read_everything(staged, files)  # the unstaged rest is still readable, from the remote


def test_disk_full_during_staging(dataset, tmpfs_dir):
    root, _ = dataset
    big = {f"big/{i}.bin": os.urandom(300_000) for i in range(6)}  # 1.8 MB into a 1 MiB tmpfs
    for rel, data in big.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    # min_free_bytes=None: let the writes run into ENOSPC instead of stopping before it.
    with StagedSource(root, tmpfs_dir / "stage", min_free_bytes=None) as staged:
        for rel, data in big.items():
            assert staged.read(rel) == data
        assert "disk full" in staged.staging_stopped
        stats = staged.stats()
        assert 0 < stats["staged_items"] < len(big)
        assert os.listdir(tmpfs_dir / "stage" / ".coordl" / "tmp") == []  # no half-written copy left behind
    with StagedSource(root, tmpfs_dir / "stage") as staged:  # whatever the manifest lists is complete
        for rel in staged.manifest.entries:
            assert staged.read(rel) == big[rel]
        assert staged.stats()["remote_bytes_read"] == 0


def test_low_free_space_stops_staging_before_the_disk_fills(dataset, tmpfs_dir):
    root, files = dataset
    with StagedSource(root, tmpfs_dir / "stage", min_free_bytes=2 << 20) as staged:
        _read_everything(staged, files)
        assert staged.stats()["staged_items"] == 0
        assert "free" in staged.staging_stopped


def test_two_stagers_at_once_stay_within_the_budget(dataset, tmp_path):
    """Both pass the early check while the other is still reading; only one copy fits, so only one is kept."""
    import threading

    from nfs_cache.sources import LocalSource

    root, files = dataset
    both_read = threading.Barrier(2, timeout=30)

    class MeetingSource(LocalSource):
        def read(self, relpath: str) -> bytes:
            data = super().read(relpath)
            both_read.wait()  # each stager has checked the budget and holds its file's bytes
            return data

    names = sorted(files)
    a = names[0]
    stripe = StagedSource(root, tmp_path / "probe").locks.path_for
    b = next(n for n in names[1:] if stripe(n) != stripe(a))  # not one file lock: both must read at once
    budget = max(len(files[a]), len(files[b])) + min(len(files[a]), len(files[b])) // 2
    stagers = [
        StagedSource(MeetingSource(str(root)), tmp_path / "stage", budget_bytes=budget) for _ in range(2)
    ]
    threads = [threading.Thread(target=s.read, args=(rel,)) for s, rel in zip(stagers, (a, b), strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    with StagedSource(root, tmp_path / "stage") as check:
        staged = check.manifest.total_bytes
        assert 0 < staged <= budget, f"{staged} bytes staged over a budget of {budget}"
        assert len(check.manifest.entries) == 1
    for s in stagers:
        s.close()

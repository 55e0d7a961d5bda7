"""ImageFolder(src, stage_dir=...): loader.stats() counts staging done in every worker."""

from __future__ import annotations

from pathlib import Path

import pytest

import coordl
from coordl.datasets.synth import make_dataset


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


# -- a stage directory read as a dataset ---------------------------------------------------------------------------


def _tree(root: Path, classes: int = 3, per_class: int = 4) -> Path:
    """Class folders of small files named .jpg (listing needs no decodable image)."""
    for c in range(classes):
        for i in range(per_class):
            path = root / f"class{c}" / f"{i:03d}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(bytes([c, i]) * (100 + 10 * i))
    return root


def test_complete_stage_dir_loads_like_its_source(tmp_path):
    from nfs_cache import stage_all

    src, dst = _tree(tmp_path / "src"), tmp_path / "dst"
    stage_all(src, dst, progress=False)
    want, got = coordl.ImageFolder(src), coordl.ImageFolder(dst)
    assert got.classes == want.classes == ["class0", "class1", "class2"]  # no ".coordl", no "files"
    assert got.items == want.items and got.targets == want.targets
    assert [got.fetch(i) for i in range(len(got))] == [want.fetch(i) for i in range(len(want))]
    assert sorted(p.name for p in dst.iterdir()) == [".coordl", "class0", "class1", "class2"]


def test_partial_stage_dir_refuses_instead_of_wrong_labels(tmp_path):
    from nfs_cache import stage_all
    from nfs_cache.layout import StageDirError

    src, dst = _tree(tmp_path / "src"), tmp_path / "dst"
    summary = stage_all(
        src, dst, progress=False, budget_bytes=1500
    )  # class0 only: class1/2 would shift labels
    assert 0 < summary["staged_files"] < 12
    with pytest.raises(StageDirError, match=r"partial stage .*ImageFolder\('.*src', stage_dir='.*dst'\)"):
        coordl.ImageFolder(dst)
    staged = coordl.ImageFolder(str(src), stage_dir=str(dst))  # what the message says to do
    assert staged.targets == coordl.ImageFolder(src).targets


def test_old_layout_stage_dir_is_refused_and_the_conversion_it_prints_works(tmp_path):
    import re
    import subprocess

    from nfs_cache import StagedSource, stage_all
    from nfs_cache.layout import StageDirError

    src, dst = _tree(tmp_path / "src"), tmp_path / "dst"
    stage_all(src, dst, progress=False)
    # Rebuild the layout of the previous release: copies in files/, bookkeeping at the top.
    (dst / "files").mkdir()
    for c in ("class0", "class1", "class2"):
        (dst / c).rename(dst / "files" / c)
    for name in ("manifest.log", "source.txt"):
        (dst / ".coordl" / name).rename(dst / name)
    (dst / ".coordl" / "locks").rename(dst / "locks")
    (dst / ".coordl" / "tmp").rename(dst / "tmp")
    (dst / ".coordl" / "listing.txt").unlink()
    (dst / ".coordl" / "index.bin").unlink()  # the manifest's index came later still
    (dst / ".coordl").rmdir()
    with pytest.raises(StageDirError, match="older coordl") as err:
        coordl.ImageFolder(dst)
    with pytest.raises(StageDirError, match="older coordl"):
        StagedSource(src, dst)
    convert = re.search(r"convert it in place \(no copying\): (.*)$", str(err.value)).group(1)
    subprocess.run(["bash", "-c", convert], check=True, timeout=30)
    assert stage_all(src, dst, progress=False)["staged_files"] == 0  # nothing copied again
    assert coordl.ImageFolder(dst).targets == coordl.ImageFolder(src).targets


def test_hidden_folders_and_files_are_not_items(tmp_path):
    root = _tree(tmp_path / "data", classes=2)
    for hidden in (".git/x.jpg", ".ipynb_checkpoints/y.jpg", "class0/.thumbs/z.jpg", "class1/._a.jpg"):
        (root / hidden).parent.mkdir(parents=True, exist_ok=True)
        (root / hidden).write_bytes(b"x")
    ds = coordl.ImageFolder(root)
    assert ds.classes == ["class0", "class1"] and len(ds) == 8

"""The stage directory mirrors its source; bookkeeping stays in DST/.coordl/; unsafe directories are refused."""

from __future__ import annotations

import pytest

from nfs_cache import StagedSource, stage_all
from nfs_cache.layout import StageDirError, StageLayout, stage_status


def test_copies_mirror_the_source_and_bookkeeping_is_hidden(dataset, tmp_path):
    root, files = dataset
    dst = tmp_path / "stage"
    summary = stage_all(root, dst, progress=False)
    assert summary["staged_files"] == len(files)
    for rel, data in files.items():
        assert (dst / rel).read_bytes() == data
    assert sorted(p.name for p in dst.iterdir()) == [".coordl", "class0", "class1", "class2"]
    assert sorted(p.name for p in (dst / ".coordl").iterdir()) == [
        "index.bin", "listing.txt", "locks", "manifest.log", "source.txt", "tmp"]  # fmt: skip
    assert StageLayout(str(dst)).read_listing() == sorted(files)
    assert stage_status(dst).missing == []


def test_partial_stage_reports_what_is_missing(dataset, tmp_path):
    root, files = dataset
    with StagedSource(root, tmp_path / "stage") as staged:
        rels = staged.list_files()
        staged.read(rels[0])
    status = stage_status(tmp_path / "stage", lambda r: r.endswith(".jpg"))
    assert status.source == str(root)
    assert status.listed == len(files) - 1 and status.missing == [r for r in rels[1:] if r.endswith(".jpg")]


def test_non_empty_foreign_directory_is_refused(dataset, tmp_path):
    root, _ = dataset
    home = tmp_path / "home"
    (home / "thesis").mkdir(parents=True)
    (home / ".bashrc").write_text("")
    with pytest.raises(StageDirError, match="not empty .*thesis"):
        StagedSource(root, home)
    assert sorted(p.name for p in home.iterdir()) == [".bashrc", "thesis"]  # nothing written


def test_stage_dir_inside_the_source_is_refused(dataset, tmp_path):
    root, _ = dataset
    for dst in (root, root / "staged"):
        with pytest.raises(StageDirError, match="overlap"):
            StagedSource(root, dst)


def test_staging_a_stage_directory_leaves_its_bookkeeping_out(dataset, tmp_path):
    root, files = dataset
    stage_all(root, tmp_path / "one", progress=False)
    summary = stage_all(tmp_path / "one", tmp_path / "two", progress=False)
    assert summary["files"] == len(files)
    assert StageLayout(str(tmp_path / "two")).read_source() == str(tmp_path / "one")


def test_bookkeeping_paths_cannot_be_read_through(dataset, tmp_path):
    root, _ = dataset
    (root / ".coordl").mkdir()
    (root / ".coordl" / "manifest.log").write_bytes(b"evil")
    with StagedSource(root, tmp_path / "stage") as staged, pytest.raises(ValueError, match="bookkeeping"):
        staged.read(".coordl/manifest.log")
    assert b"evil" not in (tmp_path / "stage" / ".coordl" / "manifest.log").read_bytes()


def test_changed_remote_file_leaves_no_stale_visible_copy(dataset, tmp_path):
    root, _ = dataset
    rel = "class2/img 000.jpg"
    stage_all(root, tmp_path / "stage", progress=False)
    (root / rel).write_bytes(b"new content")
    with StagedSource(root, tmp_path / "stage") as staged:
        staged.list_files()
        assert not (
            tmp_path / "stage" / rel
        ).exists()  # a reader of the plain folder cannot see the old bytes
        assert staged.read(rel) == b"new content"
    assert (tmp_path / "stage" / rel).read_bytes() == b"new content"

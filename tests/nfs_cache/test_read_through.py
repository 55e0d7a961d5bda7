"""Read-through staging from a mounted directory: first read copies, later reads are local and verified."""

from __future__ import annotations

import multiprocessing
import os
import pickle

import pytest

from nfs_cache import StagedSource
from tests.nfs_cache.conftest import CountingCounters


def test_first_read_stages_and_second_read_is_local(dataset, tmp_path):
    root, files = dataset
    counters = CountingCounters()
    with StagedSource(root, tmp_path / "stage", counters=counters) as staged:
        rel = "class1/img 002.jpg"
        assert staged.read(rel) == files[rel]
        assert staged.stats()["remote_bytes_read"] == len(files[rel])
        assert (tmp_path / "stage" / rel).read_bytes() == files[rel]
        assert staged.read(rel) == files[rel]
        stats = staged.stats()
        assert stats["remote_bytes_read"] == len(files[rel]) == counters.remote_bytes_read
        assert stats["staged_items"] == 1 and stats["staged_bytes"] == len(files[rel])
        assert os.listdir(tmp_path / "stage" / ".coordl" / "tmp") == []


def test_list_files_sorted_and_filtered(dataset, tmp_path):
    root, files = dataset
    with StagedSource(root, tmp_path / "stage") as staged:
        assert staged.list_files() == sorted(files)
        assert staged.list_files(extensions=[".JPG"]) == sorted(f for f in files if f.endswith(".jpg"))
        assert staged.describe("class0/notes.txt") == str(root / "class0" / "notes.txt")


def test_paths_outside_the_dataset_are_refused(dataset, tmp_path):
    root, _ = dataset
    with StagedSource(root, tmp_path / "stage") as staged, pytest.raises(ValueError, match=r"\.\."):
        staged.read("../etc/passwd")


def test_stage_dir_of_another_dataset_is_refused(dataset, tmp_path):
    root, _ = dataset
    StagedSource(root, tmp_path / "stage").close()
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(ValueError, match="stage_dir"):
        StagedSource(other, tmp_path / "stage")


def test_changed_remote_file_is_restaged(dataset, tmp_path):
    root, files = dataset
    rel = "class2/img 000.jpg"
    with StagedSource(root, tmp_path / "stage") as staged:
        staged.list_files()
        staged.read(rel)
    (root / rel).write_bytes(b"new content")
    with StagedSource(root, tmp_path / "stage") as staged:
        staged.list_files()  # notices the size change and forgets the stale copy
        assert staged.read(rel) == b"new content"


def _read_all_in_child(blob: bytes, rels: list[str], out) -> None:
    staged = pickle.loads(blob)
    out.put([staged.read(r) for r in rels])


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_pickled_into_worker_processes(dataset, tmp_path, method):
    root, files = dataset
    staged = StagedSource(root, tmp_path / "stage")
    rels = staged.list_files()[:5]
    staged.read(rels[0])
    ctx = multiprocessing.get_context(method)
    out = ctx.Queue()
    proc = ctx.Process(target=_read_all_in_child, args=(pickle.dumps(staged), rels, out))
    proc.start()
    got = out.get(timeout=60)
    proc.join(30)
    assert got == [files[r] for r in rels]
    assert staged.stats()["staged_items"] == 5  # the child's copies are visible to the parent
    staged.close()

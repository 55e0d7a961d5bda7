"""``kill -9`` in the middle of staging: a restart resumes without re-copying and never serves a partial file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from nfs_cache import StagedSource
from nfs_cache.manifest import Entry, Manifest

_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from nfs_cache import StagedSource
    staged = StagedSource(sys.argv[1], sys.argv[2])
    rels = staged.list_files()
    for rel in rels[:5]:
        staged.read(rel)
    # Die with the 6th copy written to tmp/ but not yet renamed into place.
    os.replace = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    staged.read(rels[5])
    """
)


def test_kill_9_during_copy_then_restart(dataset, tmp_path):
    root, files = dataset
    stage = tmp_path / "stage"
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(root), str(stage)], timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert len(os.listdir(stage / ".coordl" / "tmp")) == 1  # the interrupted copy
    with StagedSource(root, stage) as staged:
        assert os.listdir(stage / ".coordl" / "tmp") == []  # the dead owner's partial copy is removed
        rels = staged.list_files()
        assert staged.stats()["staged_items"] == 5
        for rel in rels:
            assert staged.read(rel) == files[rel]
        stats = staged.stats()
        assert stats["remote_bytes_read"] == sum(len(files[r]) for r in rels[5:])  # the first 5 not re-copied
        assert stats["staged_items"] == len(rels)


def test_torn_manifest_line_is_ignored(dataset, tmp_path):
    root, files = dataset
    stage = tmp_path / "stage"
    with StagedSource(root, stage) as staged:
        rels = staged.list_files()
        staged.read(rels[0])
    with open(stage / ".coordl" / "manifest.log", "ab") as f:
        f.write(b"0badc0de + 12 0 000")  # a crash in the middle of an append
    with StagedSource(root, stage) as staged:
        assert staged.stats()["staged_items"] == 1
        staged.read(rels[1])
    with StagedSource(root, stage) as staged:
        assert staged.stats()["staged_items"] == 2  # the record after the torn line parses
        assert staged.read(rels[1]) == files[rels[1]]
        assert staged.stats()["remote_bytes_read"] == 0


def test_manifest_last_record_wins_and_is_shared(tmp_path):
    path = str(tmp_path / "manifest.log")
    a, b = Manifest(path), Manifest(path)
    a.add("x/y z.jpg", Entry(10, 1, 0xABC))
    a.add("x/y z.jpg", Entry(11, 2, 0xDEF))
    b.refresh()
    assert b.get("x/y z.jpg") == Entry(11, 2, 0xDEF) and b.total_bytes == 11
    b.remove("x/y z.jpg")
    a.refresh()
    assert a.get("x/y z.jpg") is None and a.total_bytes == 0

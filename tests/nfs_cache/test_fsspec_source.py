"""fsspec URLs are a source too (here ``memory://``, which needs no server)."""

from __future__ import annotations

import fsspec

from nfs_cache import FsspecSource, StagedSource, open_source


def test_memory_filesystem_read_through(tmp_path):
    fs = fsspec.filesystem("memory")
    files = {"a/x.jpg": b"x" * 100, "a/y.jpg": b"y" * 50, "b/z.png": b"z"}
    for rel, data in files.items():
        fs.pipe(f"/nfsc-test/{rel}", data)
    try:
        assert isinstance(open_source("memory://nfsc-test"), FsspecSource)
        with StagedSource("memory://nfsc-test", tmp_path / "stage") as staged:
            assert staged.list_files() == sorted(files)
            assert staged.list_files(extensions=["jpg"]) == ["a/x.jpg", "a/y.jpg"]
            for rel, data in files.items():
                assert staged.read(rel) == data
                assert staged.read(rel) == data
            assert staged.stats()["remote_bytes_read"] == sum(len(d) for d in files.values())
            assert staged.stats()["staged_items"] == 3
    finally:
        fs.rm("/nfsc-test", recursive=True)

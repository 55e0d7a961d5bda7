"""Against a real NFS server: nfs-ganesha exports the generated dataset, libnfs reads it (NFSv4, free port)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nfs_cache import NfsSource, StagedSource, stage_all
from tests.nfs_cache.conftest import CountingCounters

pytestmark = pytest.mark.nfs


def test_listing_and_reads_match_the_export(nfs_dataset):
    server, files = nfs_dataset
    src = NfsSource(server.url())
    assert [f.relpath for f in src.list_files()] == sorted(files)
    assert {f.relpath: f.size for f in src.list_files()} == {r: len(d) for r, d in files.items()}
    rel = "class2/img 005.jpg"
    assert src.read(rel) == files[rel]
    src.close()


def test_missing_file_names_the_url(nfs_dataset):
    server, _ = nfs_dataset
    with pytest.raises(FileNotFoundError, match="nope.jpg"):
        NfsSource(server.url()).read("class0/nope.jpg")


def test_wrong_port_fails_fast_naming_the_url(nfs_dataset):
    server, _ = nfs_dataset
    url = server.url().replace(f"nfsport={server.port}", "nfsport=1")
    with pytest.raises(ConnectionError, match="nfsport=1"):
        NfsSource(url).list_files()


def test_read_through_staging_over_nfs(nfs_dataset, tmp_path):
    server, files = nfs_dataset
    counters = CountingCounters()
    with StagedSource(server.url(), tmp_path / "stage", counters=counters) as staged:
        rels = staged.list_files(extensions=[".jpg"])
        for _ in range(2):  # epoch 1 stages through NFS, epoch 2 is local
            for rel in rels:
                assert staged.read(rel) == files[rel]
        stats = staged.stats()
        assert stats["staged_items"] == len(rels)
        assert counters.remote_bytes_read == stats["remote_bytes_read"] == sum(len(files[r]) for r in rels)
        assert staged.describe(rels[0]).startswith(f"nfs://{server.host}/export/class0/")


def test_subdirectory_url(nfs_dataset, tmp_path):
    server, files = nfs_dataset
    with StagedSource(server.url("class1"), tmp_path / "stage") as staged:
        rels = staged.list_files()
        assert rels == sorted(r[len("class1/") :] for r in files if r.startswith("class1/"))
        assert staged.read(rels[0]) == files["class1/" + rels[0]]


def test_forked_child_opens_its_own_nfs_connection(nfs_dataset, tmp_path):
    server, files = nfs_dataset
    staged = StagedSource(server.url(), tmp_path / "stage")
    rels = staged.list_files()
    staged.read(rels[0])  # the parent's libnfs context exists before the fork
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            ok = staged.read(rels[1]) == files[rels[1]]
            os._exit(0 if ok else 3)
        except BaseException:
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert staged.read(rels[2]) == files[rels[2]]  # the parent's connection still works
    staged.close()


def test_stage_all_over_nfs_then_rerun(nfs_dataset, tmp_path):
    server, files = nfs_dataset
    summary = stage_all(server.url(), tmp_path / "stage", progress=False, workers=1)
    assert summary["files"] == len(files) == summary["staged_files"]
    assert summary["staged_bytes"] == sum(len(d) for d in files.values())
    for rel, data in files.items():
        assert (tmp_path / "stage" / rel).read_bytes() == data
    again = stage_all(server.url(), tmp_path / "stage", progress=False, workers=2)
    assert again["staged_files"] == 0 and again["already_files"] == len(files)


@pytest.mark.slow  # the coordl entry point imports torch: about 10 s on a loaded 2-core machine
def test_coordl_stage_cli(nfs_dataset, tmp_path):
    server, files = nfs_dataset
    cmd = [
        sys.executable,
        "-m",
        "coordl.cli",
        "stage",
        server.url(),
        str(tmp_path / "st"),
        "--json",
        "--workers",
        "2",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["staged_files"] == len(files)


def test_stage_cli_summary_and_rerun(nfs_dataset, tmp_path, capsys):
    server, files = nfs_dataset
    from nfs_cache.cli import main

    assert main([server.url(), str(tmp_path / "st"), "--no-progress", "--workers", "2"]) == 0
    first = capsys.readouterr().out
    assert f"staged {len(files)} files" in first and "MB/s" in first
    assert main([server.url(), str(tmp_path / "st"), "--no-progress"]) == 0
    assert f"{len(files)} were already staged" in capsys.readouterr().out
    assert main(["/nonexistent/dir", str(tmp_path / "x"), "--no-progress"]) == 1
    assert "/nonexistent/dir" in capsys.readouterr().err


def test_background_prefetch_stages_everything(nfs_dataset, tmp_path):
    server, files = nfs_dataset
    with StagedSource(server.url(), tmp_path / "stage", prefetch=True) as staged:
        rel = sorted(files)[-1]
        assert staged.read(rel) == files[rel]  # training reads while the prefetch copies
        assert staged.wait_prefetch(60)
        assert staged.stats()["staged_items"] == len(files)

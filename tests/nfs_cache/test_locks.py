"""Several processes reading the same files at once copy each file exactly once."""

from __future__ import annotations

import multiprocessing

from nfs_cache import StagedSource
from nfs_cache.manifest import parse_lines
from tests.nfs_cache.conftest import CountingCounters


def _reader(root: str, stage: str, counters: CountingCounters, barrier, seed: int) -> None:
    import random

    staged = StagedSource(root, stage, counters=counters)
    rels = staged.list_files()
    random.Random(seed).shuffle(rels)
    barrier.wait(30)
    for rel in rels:
        staged.read(rel)
    staged.close()


def test_concurrent_readers_copy_each_file_once(dataset, tmp_path):
    root, files = dataset
    stage = tmp_path / "stage"
    StagedSource(root, stage).close()
    counters = CountingCounters()
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(4)
    procs = [
        ctx.Process(target=_reader, args=(str(root), str(stage), counters, barrier, s)) for s in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert counters.remote_bytes_read == sum(len(d) for d in files.values())
    log = (stage / ".coordl" / "manifest.log").read_bytes()
    names, _, added = parse_lines(log)
    assert len(names) == log.count(b"\n") and added.all()  # every line intact, every one an addition
    assert sorted(names) == sorted(files)  # one record per file: nobody copied twice

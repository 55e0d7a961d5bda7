"""TarShards: the same samples and labels as the ImageFolder it was packed from, and clear errors on bad shards."""

from __future__ import annotations

import glob
import io
import logging
import os
import pickle
import re
import shutil
import tarfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import coordl
from coordl.errors import CorruptItemError
from coordl.packed.shards import TruncatedShardError
from coordl.packed.tar import TarShards
from tests.coordl.packed.conftest import N_ITEMS


def _shards(pattern: str) -> list[str]:
    return sorted(glob.glob(os.path.join(os.path.dirname(pattern), "data-*.tar")))


def test_same_bytes_labels_and_decoded_images_as_imagefolder(image_root, tar_pattern):
    folder = coordl.ImageFolder(image_root)
    ds = TarShards(tar_pattern)
    assert len(_shards(tar_pattern)) > 2  # the fixture spreads the items over several shards
    assert len(ds) == len(folder) == N_ITEMS and ds.targets == folder.targets
    for i in range(len(ds)):
        assert ds.fetch(i) == folder.fetch(i)
        image, label = ds.prep(ds.fetch(i), i)
        ref_image, ref_label = folder[i]
        assert label == ref_label and np.array_equal(image, ref_image)
    assert "class_000/000000.jpg @ offset" in ds.describe(0)
    assert ds.storage_files() == _shards(tar_pattern)


def test_directory_pattern_and_threads_and_pickle(tar_pattern):
    ds = TarShards(os.path.dirname(tar_pattern))  # a directory: every *.tar in it
    ref = [ds.fetch(i) for i in range(len(ds))]
    with ThreadPoolExecutor(8) as pool:  # pread has no shared file position: threads may read at once
        assert list(pool.map(ds.fetch, list(range(len(ds))) * 4)) == ref * 4
    clone = pickle.loads(pickle.dumps(ds))
    assert [clone.fetch(i) for i in range(len(ds))] == ref


def test_few_open_descriptors_still_read_everything(tar_pattern):
    ds = TarShards(tar_pattern, max_open_shards=1)
    assert [len(ds.fetch(i)) for i in range(len(ds))] == [
        len(TarShards(tar_pattern).fetch(i)) for i in range(len(ds))
    ]
    assert len(ds._reads._fds) == 1


def test_index_is_stored_beside_the_shard_and_reused(tar_pattern, tmp_path, monkeypatch):
    shard_dir = tmp_path / "copy"
    shard_dir.mkdir()
    for path in _shards(tar_pattern):
        with open(path, "rb") as src, open(shard_dir / os.path.basename(path), "wb") as dst:
            dst.write(src.read())  # no .idx beside these copies
    calls = []
    import coordl.packed.shardfiles as shardfiles

    real = shardfiles.build_index
    monkeypatch.setattr(shardfiles, "build_index", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    first = TarShards(str(shard_dir))
    assert len(calls) == len(first.shards) and all(os.path.exists(p + ".idx") for p in calls)
    TarShards(str(shard_dir))
    assert len(calls) == len(first.shards)  # second open: every index read, none rebuilt
    os.utime(calls[0], ns=(1, 1))  # a changed shard invalidates its index
    TarShards(str(shard_dir))
    assert calls[-1] == calls[0] and len(calls) == len(first.shards) + 1


def test_unwritable_place_beside_the_shard_falls_back_to_index_dir(tar_pattern, tmp_path):
    shard = _shards(tar_pattern)[0]
    shutil.copyfile(shard, tmp_path / "s.tar")
    (tmp_path / "s.tar.idx").mkdir()  # stands for a read-only directory (root may write anywhere)
    ds = TarShards(str(tmp_path / "s.tar"), index_dir=str(tmp_path / "indexes"))
    assert os.path.isfile(tmp_path / "indexes" / "s.tar.idx")
    assert len(ds) == len(TarShards(shard))


def test_missing_shard_names_it(tar_pattern):
    pattern = re.sub(r"\.\.(\d+)\}", lambda m: f"..{int(m.group(1)) + 3:06d}}}", tar_pattern)  # 3 too many
    with pytest.raises(FileNotFoundError, match=r"shards missing, e\.g\. .*data-"):
        TarShards(pattern)


def _write(path, samples) -> None:
    with tarfile.open(path, "w") as tf:
        for name, data in samples:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def test_missing_label_is_an_error_naming_shard_and_key(image_root, tmp_path, caplog):
    jpeg = coordl.ImageFolder(image_root).fetch(0)
    _write(
        tmp_path / "s.tar",
        [("a.cls", b"1"), ("a.jpg", jpeg), ("b.jpg", jpeg), ("c.cls", b"x"), ("c.jpg", jpeg)],
    )
    with caplog.at_level(logging.WARNING, logger="coordl.tar"):
        ds = TarShards(str(tmp_path / "s.tar"))
    assert "2 samples" in caplog.text and "no readable .cls" in caplog.text
    assert ds.prep(ds.fetch(0), 0)[1] == 1
    for i, key in ((1, "b.jpg"), (2, "c.jpg")):
        with pytest.raises(CorruptItemError, match=rf"s\.tar:{key} @ offset \d+: no readable \.cls") as e:
            ds.prep(ds.fetch(i), i)
        assert e.value.index == i and "s.tar" in e.value.path


def test_undecodable_record_names_shard_and_key(tmp_path):
    _write(tmp_path / "s.tar", [("a.cls", b"1"), ("a.jpg", b"not a jpeg at all")])
    ds = TarShards(str(tmp_path / "s.tar"))
    with pytest.raises(CorruptItemError, match=r"s\.tar:a\.jpg @ offset 1536"):
        ds.prep(ds.fetch(0), 0)


def test_truncated_shard_raises_or_keeps_what_precedes_the_cut(tar_pattern, tmp_path):
    path = tmp_path / "s.tar"
    with open(_shards(tar_pattern)[0], "rb") as f:
        whole = f.read()
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(TruncatedShardError, match=r"s\.tar: truncated.*offset"):
        TarShards(str(path))
    ds = TarShards(str(path), truncated="skip")
    full = TarShards(_shards(tar_pattern)[0])
    assert 0 < len(ds) < len(full)
    assert [ds.fetch(i) for i in range(len(ds))] == [full.fetch(i) for i in range(len(ds))]


def test_shard_truncated_after_indexing_is_a_corrupt_item(tar_pattern, tmp_path):
    path = tmp_path / "s.tar"
    with open(_shards(tar_pattern)[0], "rb") as f:
        path.write_bytes(f.read())
    ds = TarShards(str(path))
    last = len(ds) - 1
    os.truncate(path, int(ds._offsets[last]) + 10)  # cut under a reader that already has the index
    with pytest.raises(CorruptItemError, match=rf"s\.tar:.* @ offset {int(ds._offsets[last])}: read 10 of"):
        ds.fetch(last)


def test_split_pattern_of_urls_and_paths(tmp_path):
    from coordl.packed.tar import _split_pattern

    assert _split_pattern("nfs://h/export/tr/data-{0..3}.tar?version=4") == (
        "nfs://h/export/tr?version=4",
        "data-{0..3}.tar",
    )
    assert _split_pattern("nfs://h/export/tr?version=4") == ("nfs://h/export/tr?version=4", "")
    assert _split_pattern(str(tmp_path)) == (str(tmp_path), "")
    assert _split_pattern(str(tmp_path / "a-{0..1}.tar")) == (str(tmp_path), "a-{0..1}.tar")


def test_bad_arguments():
    with pytest.raises(ValueError, match="truncated"):
        TarShards("x.tar", truncated="maybe")
    with pytest.raises(ValueError, match="stage_dir"):
        TarShards("nfs://127.0.0.1/export/data-{0..1}.tar")


def _threads_read_all_in_child(ds: TarShards, threads: int, conn) -> None:
    """In a forked child: ``threads`` threads read every sample at once (a worker's fetch-ahead)."""
    import threading

    start = threading.Barrier(threads)
    errors: list[str] = []

    def read(offset: int) -> None:
        start.wait()
        try:
            for i in range(len(ds)):
                ds.fetch((i + offset) % len(ds))
        except Exception as e:  # reported to the parent
            errors.append(repr(e))

    pool = [threading.Thread(target=read, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    conn.send(errors)


def test_forked_worker_threads_switch_to_their_own_descriptors_once(tar_pattern):
    """Regression: a forked worker's fetch-ahead threads each closed the parent's descriptors (EBADF)."""
    import multiprocessing as mp

    ds = TarShards(tar_pattern)
    for i in range(len(ds)):  # the parent holds open descriptors that every child inherits
        ds.fetch(i)
    ctx = mp.get_context("fork")
    for _ in range(12):  # the race needed several children to show on the old code (4 of 25 loader runs)
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_threads_read_all_in_child, args=(ds, 8, child))
        p.start()
        assert parent.poll(60), "the child hung"
        assert parent.recv() == []
        p.join(10)
        assert p.exitcode == 0

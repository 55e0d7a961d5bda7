"""LMDBDataset: the ImageFolder's samples and labels, one environment per process, clear errors on damage."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import shutil
import struct
from concurrent.futures import ThreadPoolExecutor

import lmdb
import numpy as np
import pytest

import coordl
import coordl.packed.lmdbenv as lmdbenv
from coordl.errors import CorruptItemError
from coordl.packed.lmdb import LMDBDataset, record_key, unpack_record
from coordl.packing.pack import pack
from tests.coordl.packed.conftest import N_CLASSES, N_ITEMS


def test_same_samples_and_labels_as_imagefolder(image_root, lmdb_path):
    folder = coordl.ImageFolder(image_root)
    ds = LMDBDataset(lmdb_path)
    assert len(ds) == N_ITEMS and ds.targets == folder.targets and len(ds.classes) == N_CLASSES
    for i in range(len(ds)):
        raw = ds.fetch(i)
        payload, label, _crc = unpack_record(raw)
        assert bytes(payload) == folder.fetch(i) and label == folder.targets[i]
        image, target = ds.prep(raw, i)
        assert target == folder.targets[i] and np.array_equal(image, folder[i][0])
    with pytest.raises(IndexError):
        ds.fetch(N_ITEMS)


def test_threads_share_the_environment(lmdb_path):
    ds = LMDBDataset(lmdb_path)
    ref = [ds.fetch(i) for i in range(len(ds))]
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(ds.fetch, list(range(len(ds))) * 4)) == ref * 4


def _child_reads(ds, path, q):
    inherited = lmdbenv._envs[path].pid  # the parent's pid: its environment came through fork
    data = ds.fetch(3)
    q.put((inherited, lmdbenv._envs[path].pid == os.getpid(), data))


def test_forked_child_opens_its_own_environment(lmdb_path):
    ds = LMDBDataset(lmdb_path)
    parent_env = ds._env_here()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_reads, args=(ds, ds._data_path, q))
    p.start()
    inherited, own, data = q.get(timeout=60)
    p.join(30)
    assert p.exitcode == 0 and inherited == os.getpid() and own and data == ds.fetch(3)
    assert ds._env_here() is parent_env  # the parent's is untouched by the child's close
    other = LMDBDataset(lmdb_path)  # a second dataset on the same file shares the environment
    assert other._env_here() is parent_env
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.fetch(3) == ds.fetch(3)


def _copy(lmdb_path, tmp_path) -> str:
    dst = str(tmp_path / "copy.lmdb")
    shutil.copytree(lmdb_path, dst)
    return dst


def test_damaged_payload_is_a_corrupt_item_naming_the_key(lmdb_path, tmp_path):
    path = _copy(lmdb_path, tmp_path)
    ds = LMDBDataset(path)
    good = ds.fetch(5)
    ds.close()
    with open(os.path.join(path, "data.mdb"), "rb") as f:
        data = f.read()
    at = data.index(good[-200:-100])  # inside record 5's payload (JPEG headers repeat, their ends do not)
    with open(os.path.join(path, "data.mdb"), "r+b") as f:
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in good[-200:-196]))
    with pytest.raises(CorruptItemError, match=r"copy\.lmdb:key 5 .*CRC32 mismatch") as e:
        ds.prep(ds.fetch(5), 5)
    assert e.value.index == 5


def test_record_label_differing_from_the_table_is_refused(lmdb_path, tmp_path):
    path = _copy(lmdb_path, tmp_path)
    ds = LMDBDataset(path)
    raw = bytearray(ds.fetch(2))
    struct.pack_into("<q", raw, 8, 99)  # the header's label
    with pytest.raises(CorruptItemError, match="label 99 differs"):
        ds.prep(bytes(raw), 2)


def test_not_lmdb_truncated_and_foreign_environments(lmdb_path, tmp_path):
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "data.mdb").write_bytes(os.urandom(64 << 10))
    with pytest.raises(ValueError, match=r"garbage/data\.mdb is not a readable LMDB"):
        LMDBDataset(str(garbage))
    cut = _copy(lmdb_path, tmp_path)
    size = os.path.getsize(os.path.join(cut, "data.mdb"))
    os.truncate(os.path.join(cut, "data.mdb"), size - 8192)
    with pytest.raises(ValueError, match="truncated"):
        LMDBDataset(cut)
    foreign = str(tmp_path / "foreign")
    with lmdb.open(foreign, map_size=1 << 20) as env, env.begin(write=True) as txn:
        txn.put(b"img0", b"pickle-free but not ours")
    with pytest.raises(ValueError, match="not written by coordl pack"):
        LMDBDataset(foreign)
    with pytest.raises(FileNotFoundError, match="no LMDB data file"):
        LMDBDataset(str(tmp_path / "nowhere"))


def test_missing_record_is_a_corrupt_item(lmdb_path, tmp_path):
    path = _copy(lmdb_path, tmp_path)
    ds = LMDBDataset(path)
    ds.close()  # py-lmdb opens a file once per process: the writer below needs it closed
    with lmdb.open(path, map_size=1 << 30) as env, env.begin(write=True) as txn:
        txn.delete(record_key(7))
        txn.put(b"__zz_filler__", b"keeps the entry count")
    with pytest.raises(CorruptItemError, match="key 7 .*record missing"):
        ds.fetch(7)


class _BigRecords:
    """An item source of random payloads (20 KB by default: records that span several pages of the map)."""

    def __init__(self, n: int = 6, size: int = 20_000) -> None:
        rng = np.random.default_rng(0)
        self.payloads = [rng.bytes(size + 97 * i) for i in range(n)]
        self.targets = list(range(n))

    def __len__(self) -> int:
        return len(self.payloads)

    def fetch(self, i: int) -> bytes:
        return self.payloads[i]

    def prep(self, raw: bytes, i: int):
        return raw, self.targets[i]


def test_multi_page_records_are_read_with_one_pread_each(tmp_path):
    src = _BigRecords()
    assert pack(src, str(tmp_path / "big"), "lmdb", progress=False).ok
    calls = []
    real = os.pread

    def counting_pread(fd, n, offset):
        calls.append((n, offset))
        return real(fd, n, offset)

    ds = LMDBDataset(str(tmp_path / "big"))
    penv = ds._process_env()
    import unittest.mock

    with unittest.mock.patch.object(lmdbenv.os, "pread", counting_pread):
        for i in range(len(src)):
            assert bytes(ds.payload(ds.fetch(i), i)) == src.payloads[i]
    ds.close()
    assert [n for n, _ in calls] == [24 + len(p) for p in src.payloads]  # one read per record, exact size
    assert all(offset % penv.page_bytes == 16 for _, offset in calls)  # right after an overflow page header


def test_small_records_are_copied_from_the_map(tmp_path, monkeypatch):
    src = _BigRecords(size=300)  # values LMDB keeps inside its leaf pages: no page header before them
    assert pack(src, str(tmp_path / "small"), "lmdb", progress=False).ok
    ds = LMDBDataset(str(tmp_path / "small"))
    monkeypatch.setattr(lmdbenv.os, "pread", lambda *a: pytest.fail("pread for a value inside a leaf page"))
    assert [bytes(ds.payload(ds.fetch(i), i)) for i in range(len(src))] == src.payloads
    ds.close()

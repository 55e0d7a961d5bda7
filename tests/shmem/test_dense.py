"""shmem.dense.DenseTable.get_rows: a batch of rows read in one pass gives get's answers, checks included."""

from __future__ import annotations

import random

import numpy as np
import pytest

import shmem.table
from shmem.dense import DenseTable
from shmem.segment import Segment
from shmem.table import table_bytes
from tests.shmem.test_table import _publish_row_before_bytes

ROWS = 64


def _dense(tmp_path) -> tuple[Segment, DenseTable]:
    seg = Segment.create("getmany", table_bytes(ROWS, 1 << 16, dense=True), tmp_path)
    return seg, DenseTable.create(seg, ROWS, 1 << 16, dense=True)


def _value(key: int) -> bytes:
    return random.Random(key).randbytes(16 + key % 50)


@pytest.mark.parametrize("copy", [False, True], ids=["views", "bytes"])
@pytest.mark.parametrize("shared", [True, False], ids=["x86-64", "weakly-ordered"])
def test_a_batch_gets_what_get_gives_each_key(tmp_path, monkeypatch, copy, shared) -> None:
    monkeypatch.setattr(shmem.table, "_SHARED_MARKS", shared)
    seg, writer = _dense(tmp_path)
    held = range(1, ROWS + 1, 3)
    for key in held:
        writer.put(key, 0, (_value(key),))
    reader = DenseTable(seg)  # another process's table: no row checked by it yet
    rng = random.Random(7)
    keys = [rng.randrange(1, ROWS + 1) for _ in range(200)]
    for _ in range(2):  # first read: the rows are checked (through get); then served from the gather
        got = reader.get_rows(np.array(keys) - 1, copy=copy)
        assert [None if v is None else bytes(v) for v in got] == [
            _value(k) if k in held else None for k in keys
        ]
        assert all(type(v) is (bytes if copy else memoryview) for v in got if v is not None)
    view = reader.get_rows([k - 1 for k in keys])[keys.index(next(k for k in keys if k in held))]
    with pytest.raises(TypeError):
        view[0] = 0  # read-only, as get's views are
    del view, got
    reader.close()
    writer.close()
    seg.close()


def test_a_batch_refuses_a_flipped_byte_and_a_row_seen_before_its_bytes(tmp_path, monkeypatch) -> None:
    """The batched read serves at once only rows already checked; a wrong value is still refused."""
    monkeypatch.setattr(shmem.table, "_SHARED_MARKS", False)
    seg, writer = _dense(tmp_path)
    for key in range(1, 21):
        writer.put(key, 0, (_value(key),))
    writer._buf[writer._data_off + writer._row_words[5 * 4 + 2] + 3] ^= 0xFF  # key 5's bytes
    _publish_row_before_bytes(writer, 30, _value(30))
    reader = DenseTable(seg)
    keys = list(range(1, 21)) + [30]
    got = reader.get_rows([k - 1 for k in keys])
    assert got[4] is None and got[-1] is None and reader.torn_reads == 2
    assert [bytes(v) for k, v in zip(keys, got, strict=True) if k not in (5, 30)] == [
        _value(k) for k in keys if k not in (5, 30)
    ]
    assert (
        reader.get_rows([k - 1 for k in keys])[4] is None and reader.torn_reads == 4
    )  # checked again, refused again
    del got
    reader.close()
    writer.close()
    seg.close()


def test_a_key_outside_the_table_is_named(tmp_path) -> None:
    seg, table = _dense(tmp_path)
    with pytest.raises(KeyError, match="key 64 is outside the table's 0..63"):
        table.get_rows(list(range(30)) + [64])
    table.close()
    seg.close()


@pytest.mark.parametrize("shared", [True, False], ids=["x86-64", "weakly-ordered"])
def test_a_batch_checks_each_row_once_and_marks_it_for_later_processes(tmp_path, monkeypatch, shared) -> None:
    """A loader's workers read rows the other workers wrote: the first batch that reads a row checks it
    (a CRC), later batches of that process do not, nor, on x86-64, any other process (the row's mark)."""
    monkeypatch.setattr(shmem.table, "_SHARED_MARKS", shared)
    seg, writer = _dense(tmp_path)
    for key in range(1, 33):
        writer.put(key, 0, (_value(key),))
    calls: list[int] = []
    real = shmem.table._check
    monkeypatch.setattr(shmem.table, "_check", lambda *a: calls.append(a[0]) or real(*a))
    first, later = DenseTable(seg), DenseTable(seg)
    keys = list(range(1, 33))
    rows = [k - 1 for k in keys]
    assert [bytes(v) for v in first.get_rows(rows)] == [_value(k) for k in keys] and calls == keys
    assert [bytes(v) for v in first.get_rows(rows)] == [_value(k) for k in keys] and calls == keys
    assert [bytes(v) for v in later.get_rows(rows)] == [_value(k) for k in keys]
    assert calls == (keys if shared else keys + keys)
    for table in (first, later, writer):
        table.close()
    seg.close()

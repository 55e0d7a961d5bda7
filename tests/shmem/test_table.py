"""shmem.table.AppendTable: never evicts, never overwrites, and never serves bytes it did not see whole."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import random
import time

import pytest

from shmem.segment import Segment
from shmem.table import ROW_WORDS, AppendTable, table_bytes


def _table(tmp_path, max_items=64, data_bytes=1 << 16, **kw) -> tuple[Segment, AppendTable]:
    seg = Segment.create(
        "tabletest", table_bytes(max_items, data_bytes, dense=kw.get("dense", False)), tmp_path
    )
    return seg, AppendTable.create(seg, max_items, data_bytes, **kw)


def _value(key: int, n: int = 3000) -> bytes:
    return random.Random(key).randbytes(n)


def test_round_trip_dense_and_hashed(tmp_path) -> None:
    for dense in (True, False):
        seg, t = _table(tmp_path / str(dense), dense=dense)
        for k in range(1, 20):
            assert t.put(k, 0 if dense else -k, (_value(k, 100 + k),))
        for k in range(1, 20):
            assert bytes(t.get(k, 0 if dense else -k)) == _value(k, 100 + k)
        assert t.get(25 if dense else 12345, 0) is None
        assert t.stats()["items"] == 19
        t.close()
        seg.close()


def test_values_are_never_overwritten_and_parts_concatenate(tmp_path) -> None:
    seg, t = _table(tmp_path)
    assert t.put(7, 1, (b"head", memoryview(b"payload")))
    assert not t.put(7, 1, (b"other",))
    assert bytes(t.get(7, 1)) == b"headpayload"
    view = t.get(7, 1)
    assert view.readonly
    t.close()
    seg.close()


def test_first_come_first_kept_unless_stop_when_full(tmp_path) -> None:
    seg, t = _table(tmp_path / "a", data_bytes=1000)
    assert t.put(1, 0, (b"a" * 600,))
    assert not t.put(2, 0, (b"b" * 500,))  # does not fit: refused, nothing evicted
    assert t.put(3, 0, (b"c" * 400,))  # a smaller one still fits
    assert t.stats()["full"] == 0 and not t.full  # refused for its size only
    t.close()
    seg.close()
    seg, t = _table(tmp_path / "b", data_bytes=1000, stop_when_full=True)
    assert t.put(1, 0, (b"a" * 600,))
    assert not t.put(2, 0, (b"b" * 500,))
    assert not t.put(3, 0, (b"c" * 400,))  # the first refusal ended all puts
    assert t.stats()["full"] == 1 and t.full
    t.close()
    seg.close()


def test_hashed_index_stops_at_its_load_factor(tmp_path) -> None:
    seg, t = _table(tmp_path, max_items=8, data_bytes=1 << 16)  # 16 rows: at most 8 keys
    stored = sum(t.put(k, k, (b"x",)) for k in range(1, 40))
    assert stored == 8 and t.stats()["full"] == 1
    t.close()
    seg.close()


def _publish_row_before_bytes(t: AppendTable, key: int, value: bytes) -> int:
    """What a reader on a weakly ordered CPU may see: the row (key, offset, length, check) already
    published, the value's bytes not yet. Returns the row."""
    from shmem.table import _check

    with t._locked():
        row, offset = t._claim(key, 0, len(value))
    # the check of the value as it will be, stored before the bytes are (a reordering x86 never shows)
    t._row_words[ROW_WORDS * row + 4] = _check(key, 0, value)
    return row


def test_a_row_seen_before_its_bytes_is_a_miss_not_wrong_bytes(tmp_path) -> None:
    """The publication fix. The old MinIO code published a READY flag after the copy and relied on x86
    store order: with the flag seen first, it served whatever the slot held (zeros here). The check
    over the bytes makes that a miss on any CPU."""
    seg, t = _table(tmp_path, dense=True, max_items=4)
    value = _value(3)
    row = _publish_row_before_bytes(t, 3, value)
    assert t.get(3) is None and t.torn_reads == 1
    offset = t._row_words[ROW_WORDS * row + 2]
    t._buf[t._data_off + offset : t._data_off + offset + len(value)] = value  # the bytes arrive
    assert bytes(t.get(3)) == value
    t.close()
    seg.close()


def test_a_writer_killed_mid_copy_is_never_served(tmp_path) -> None:
    seg, t = _table(tmp_path, dense=True, max_items=4)
    with t._locked():
        t._claim(2, 0, 100)  # claimed, then the writer "dies": check stays 0
    assert t.get(2) is None and (2, 0) not in t
    assert not t.put(2, 0, (b"again",))  # the row stays taken; it is simply never served
    t.close()
    seg.close()


def test_a_flipped_byte_is_refused(tmp_path) -> None:
    seg, writer = _table(tmp_path)
    writer.put(5, 5, (_value(5),))
    writer._buf[writer._data_off + 100] ^= 0xFF
    reader = AppendTable(seg)  # another process's view: it has not checked the row yet
    assert reader.get(5, 5) is None and reader.torn_reads == 1
    reader.close()
    writer.close()
    seg.close()


def test_each_process_checks_a_row_once(tmp_path, monkeypatch) -> None:
    """Values are never overwritten: once a process read a row intact (or wrote it), later reads skip
    the CRC. A row that failed its check is checked again at the next read (its writer may finish)."""
    import shmem.table

    seg, writer = _table(tmp_path, dense=True, max_items=8)
    writer.put(1, 0, (_value(1),))
    calls = []
    real = shmem.table._check
    monkeypatch.setattr(shmem.table, "_check", lambda *a: calls.append(a[0]) or real(*a))
    assert bytes(writer.get(1)) == _value(1) and calls == []  # the writer wrote these bytes
    reader = AppendTable(seg)
    for _ in range(3):
        assert bytes(reader.get(1)) == _value(1)
    assert calls == [1]
    row = _publish_row_before_bytes(writer, 2, _value(2))
    calls.clear()
    assert reader.get(2) is None and reader.get(2) is None and calls == [2, 2]
    offset = writer._row_words[ROW_WORDS * row + 2]
    writer._buf[writer._data_off + offset : writer._data_off + offset + 3000] = _value(2)
    assert bytes(reader.get(2)) == _value(2) and bytes(reader.get(2)) == _value(2) and calls == [2, 2, 2]
    reader.close()
    writer.close()
    seg.close()


@pytest.mark.parametrize("shared", [True, False], ids=["x86-64", "weakly-ordered"])
def test_a_row_one_reader_checked_is_not_checked_again_by_later_processes_on_x86(
    tmp_path, monkeypatch, shared
) -> None:
    """A loader's non-persistent workers are new processes each epoch: on x86-64 the first reader's mark in
    the row spares them the CRC; elsewhere each process checks each row once (the mark is not trusted)."""
    import shmem.table

    monkeypatch.setattr(shmem.table, "_SHARED_MARKS", shared)
    seg, writer = _table(tmp_path, dense=True, max_items=8)
    for k in (1, 2):
        writer.put(k, 0, (_value(k),))
    calls = []
    real = shmem.table._check
    monkeypatch.setattr(shmem.table, "_check", lambda *a: calls.append(a[0]) or real(*a))
    ctx = mp.get_context("fork")
    child = ctx.Process(target=lambda: os._exit(0 if bytes(AppendTable(seg).get(1)) == _value(1) else 1))
    child.start()
    child.join(30)
    assert child.exitcode == 0  # a worker of the first epoch read (and checked) item 1 in its own process
    later = AppendTable(seg)  # a worker of the next epoch
    assert bytes(later.get(1)) == _value(1) and bytes(later.get(2)) == _value(2)
    assert calls == ([2] if shared else [1, 2])  # the child's check ran in the child: not counted here
    assert bytes(AppendTable(seg).get(2)) == _value(2) and calls == ([2] if shared else [1, 2, 2])
    later.close()
    writer.close()
    seg.close()


def test_a_marked_row_whose_bytes_changed_is_refused_where_marks_are_not_trusted(
    tmp_path, monkeypatch
) -> None:
    """The mark is an x86-64 shortcut, not part of the check: a weakly ordered reader still compares the CRC."""
    import shmem.table

    seg, writer = _table(tmp_path)
    writer.put(5, 5, (_value(5),))
    monkeypatch.setattr(shmem.table, "_SHARED_MARKS", True)
    assert bytes(AppendTable(seg).get(5, 5)) == _value(5)  # checked and marked
    writer._buf[writer._data_off + 100] ^= 0xFF
    monkeypatch.setattr(shmem.table, "_SHARED_MARKS", False)
    reader = AppendTable(seg)
    assert reader.get(5, 5) is None and reader.torn_reads == 1
    reader.close()
    writer.close()
    seg.close()


def _writer(table: AppendTable, keys: list[int]) -> None:
    for k in keys:
        table.put(k, 0, (_value(k, 1000 + k % 4000),))


def _reader(table: AppendTable, n_keys: int, seconds: float, out) -> None:
    rng = random.Random(os.getpid())
    bad = hits = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        k = rng.randrange(1, n_keys + 1)
        view = table.get(k)
        if view is not None:
            hits += 1
            bad += bytes(view) != _value(k, 1000 + k % 4000)
    out.put((hits, bad))


@pytest.mark.slow
def test_readers_check_every_byte_while_writers_fill_under_load(tmp_path) -> None:
    """Writers in two processes fill the table while two readers compare every byte they are served."""
    n = 3000
    seg, t = _table(tmp_path, dense=True, max_items=n, data_bytes=n * 5000)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    keys = list(range(1, n + 1))
    random.Random(0).shuffle(keys)
    readers = [ctx.Process(target=_reader, args=(t, n, 3.0, out)) for _ in range(2)]
    writers = [ctx.Process(target=_writer, args=(t, keys[i::2])) for i in range(2)]
    for p in readers + writers:
        p.start()
    results = [out.get(timeout=60) for _ in readers]
    for p in readers + writers:
        p.join(60)
        assert p.exitcode == 0
    assert sum(bad for _, bad in results) == 0
    assert sum(hits for hits, _ in results) > 0
    assert t.stats()["items"] == n
    assert all(bytes(t.get(k)) == _value(k, 1000 + k % 4000) for k in range(1, n + 1))
    t.close()
    seg.close()


def test_another_process_reads_what_this_one_wrote(tmp_path) -> None:
    seg, t = _table(tmp_path)
    t.put(9, 9, (b"shared",))
    clone = pickle.loads(pickle.dumps(t))  # what a spawned worker gets: only the segment's path travels
    assert bytes(clone.get(9, 9)) == b"shared"
    assert clone.put(10, 10, (b"from clone",)) and bytes(t.get(10, 10)) == b"from clone"
    clone.close()
    t.close()
    seg.close()


def test_bad_keys_and_foreign_bytes_are_named(tmp_path) -> None:
    seg, t = _table(tmp_path, dense=True, max_items=4)
    with pytest.raises(ValueError, match="lo != 0"):
        t.put(0, 0, (b"x",))
    with pytest.raises(KeyError, match="outside"):
        t.get(99)
    t.close()
    other = Segment.create("tabletest", 4096, tmp_path)
    with pytest.raises(ValueError, match="holds no table"):
        AppendTable(other)
    other.close()
    seg.close()


def test_a_forked_child_of_an_attached_process_puts_after_the_owner_unlinked_the_segment(tmp_path) -> None:
    # A node's MinIO cache: the creator rank closes first (its name is unlinked), another rank's next
    # epoch forks fresh workers, whose first put takes the table's lock. Opened by name, it was gone.
    seg, table = _table(tmp_path)
    attached = Segment.attach(seg.path)
    theirs = AppendTable(attached)
    assert theirs.put(1, 0, [_value(1)])
    seg_path = seg.path
    table.close()
    seg.close()  # the owner: unmaps and unlinks
    assert not os.path.exists(seg_path)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            code = 0 if theirs.put(2, 0, [_value(2)]) and bytes(theirs.get(1)) == _value(1) else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert bytes(theirs.get(2)) == _value(2)  # the child's put is in the shared table
    theirs.close()
    attached.close()

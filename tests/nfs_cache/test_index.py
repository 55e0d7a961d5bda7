"""The manifest's shared index (issue 59): each log line is parsed once on the node whatever the number of
processes, a restart parses only what was appended since and looks a listing up in bulk, and the index is
repaired or rebuilt after a writer's kill, a reboot or a full disk, never trusted when a slot reads torn."""

from __future__ import annotations

import errno
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch.utils.data

from nfs_cache import StagedSource, index, indexslots, manifest
from nfs_cache.manifest import Entry, Manifest
from shmem.strings import StringArray

N_FILES = 300


def _tree(root, n: int = N_FILES) -> list[str]:
    rels = [f"c{i % 7}/f{i:05d}.bin" for i in range(n)]
    for i, rel in enumerate(rels):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * (i % 5))
    return sorted(rels)


def _count_parsed_lines(monkeypatch, counter) -> None:
    """Count every manifest line any process parses from now on (forked children inherit the patch)."""
    real = manifest.parse_lines

    def counting(data: bytes):
        with counter.get_lock():
            counter.value += data.count(b"\n")
        return real(data)

    monkeypatch.setattr(manifest, "parse_lines", counting)


def _stage_share(root: str, stage: str, rels: list[str], start: int, step: int) -> None:
    staged = StagedSource(root, stage)
    for rel in rels[start::step]:
        staged.read(rel)
        staged.read(rels[(rels.index(rel) + 1) % len(rels)])  # and one another process may be staging
    staged.close()


def test_each_line_is_parsed_once_on_the_node(tmp_path, monkeypatch):
    rels = _tree(tmp_path / "src")
    ctx = multiprocessing.get_context("fork")
    parsed = ctx.Value("q", 0)
    _count_parsed_lines(monkeypatch, parsed)
    args = (str(tmp_path / "src"), str(tmp_path / "stage"), rels)
    procs = [ctx.Process(target=_stage_share, args=(*args, k, 4)) for k in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    lines = (tmp_path / "stage" / ".coordl" / "manifest.log").read_bytes().count(b"\n")
    assert lines == N_FILES  # each file staged once
    # Each process used to read every line the others appended: 4 readers, ~4 x the lines.
    assert parsed.value <= lines + 16, (parsed.value, lines)


def test_a_restart_parses_only_the_new_lines_and_looks_the_listing_up_in_bulk(tmp_path, monkeypatch):
    rels = _tree(tmp_path / "src")
    with StagedSource(tmp_path / "src", tmp_path / "stage") as staged:
        for rel in staged.list_files():
            staged.read(rel)
    (tmp_path / "src" / rels[5]).write_bytes(b"changed")  # a source file changed since it was staged
    other = Manifest(str(tmp_path / "stage" / ".coordl" / "manifest.log"))
    other._append("+ 3 0 00000000 new/one.bin")  # appended by a process that did not catch up
    parsed = multiprocessing.get_context("fork").Value("q", 0)
    _count_parsed_lines(monkeypatch, parsed)
    per_name = []
    monkeypatch.setattr(indexslots.Slots, "get", lambda *a: per_name.append(a) or None)
    with StagedSource(tmp_path / "src", tmp_path / "stage") as staged:
        files = staged.remote_files()
        todo = [f.relpath for f, done in zip(files, staged.staged_mask(files), strict=True) if not done]
        assert todo == [rels[5]]  # the changed file is forgotten, every other one is still staged
        assert staged.stats()["staged_items"] == N_FILES  # N - 1 of the source, and new/one.bin
    assert parsed.value == 2  # the appended line and the removal of the changed file: not the N before
    assert per_name == []  # no lookup one name at a time


def _entries(m: Manifest) -> dict[str, Entry | None]:
    return {rel: m.get(rel) for rel in ("a/1", "a/2", "a/3")}


def _write_three(path: str) -> tuple[Manifest, dict[str, Entry | None]]:
    m = Manifest(path)
    m.add("a/1", Entry(10, 1, 0xA))
    m.add("a/2", Entry(20, 2, 0xB))
    m.add("a/3", Entry(30, 3, 0xC))
    m.remove("a/2")
    return m, {"a/1": Entry(10, 1, 0xA), "a/2": None, "a/3": Entry(30, 3, 0xC)}


_KILLED_MID_WRITE = textwrap.dedent(
    """
    import os, signal, sys
    from nfs_cache import indexslots
    from nfs_cache.manifest import Entry, Manifest
    m = Manifest(sys.argv[1])
    m.refresh()
    real = indexslots._meta
    def die(*args):  # the slot's meta is 0 (being written) and the header dirty: the worst moment
        os.kill(os.getpid(), signal.SIGKILL)
    indexslots._meta = die
    m.add("a/3", Entry(33, 4, 0xD))
    """
)


def test_a_writer_killed_mid_write_is_repaired(tmp_path):
    path = str(tmp_path / "manifest.log")
    m, want = _write_three(path)
    proc = subprocess.run([sys.executable, "-c", _KILLED_MID_WRITE, path], timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert m.index._header is not None and m.index._header[index._DIRTY_W] == 1
    want["a/3"] = Entry(33, 4, 0xD)  # its record was appended before the kill: it counts
    fresh = Manifest(path)
    assert _entries(fresh) == want and fresh.totals() == (2, 43)
    assert _entries(m) == want and m.totals() == (2, 43)  # a process that mapped it before sees it too


def test_an_index_of_another_boot_is_built_again(tmp_path):
    path = str(tmp_path / "manifest.log")
    m, want = _write_three(path)
    header = m.index._header
    assert header is not None
    header[index._BOOT_LO_W] ^= 1  # as after a reboot: the index's pages may have been lost in the crash
    header[index._LIVE_W] = 99  # and wrong: it must not be trusted
    fresh = Manifest(path)
    assert _entries(fresh) == want and fresh.totals() == (2, 40)
    assert _entries(m) == want  # the old mapping was marked moved: its reader opens the new file


def test_no_room_for_the_shared_index_keeps_one_in_memory(tmp_path, monkeypatch):
    def full(fd: int, offset: int, size: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    path = str(tmp_path / "manifest.log")
    m, want = _write_three(path)
    assert m.index.private and not os.path.exists(tmp_path / "index.bin")
    assert _entries(m) == want and m.totals() == (2, 40)
    assert not [n for n in os.listdir(tmp_path / "tmp")]  # no half-made index left behind


def test_a_slot_read_torn_is_never_served(tmp_path):
    path = str(tmp_path / "manifest.log")
    m, want = _write_three(path)
    slots = m.index._slots
    assert slots is not None
    key = indexslots.name_key("a/1")
    row = [i for i in range(slots.count) if slots.table[i, 0] == key[0]]
    slots.table[row[0], 2] = 11  # the size changed under a reader, its check did not: a torn read
    assert m.get("a/1") is None and Manifest(path).get("a/1") is None  # not staged (copied again), not 11


@pytest.mark.parametrize("n", [1, 5000])
def test_bulk_and_single_lookups_agree(tmp_path, n):
    m = Manifest(str(tmp_path / "manifest.log"))
    for i in range(n):
        m._append(f"+ {i} {i * 3} {i:08x} d/{i:06d}%20x.jpg")
    m._append("- d/000000%20x.jpg")
    names = [f"d/{i:06d} x.jpg" for i in range(n)] + ["absent"]
    staged, size, mtime_ns = m.lookup(names)
    assert staged.tolist() == [i > 0 for i in range(n)] + [False]
    assert size.tolist() == [i if i else 0 for i in range(n)] + [0]
    assert mtime_ns.tolist() == [i * 3 for i in range(n)] + [0]
    assert m.get(names[0]) is None and (n < 2 or m.get(names[1]) == Entry(1, 3, 1))
    assert m.totals() == (n - 1, sum(range(n)))


class _Staging(torch.utils.data.Dataset):
    """Reads every file through a StagedSource: the first epoch stages them (each worker stages its share)."""

    def __init__(self, root: str, stage: str) -> None:
        self.staged = StagedSource(root, stage)
        self.names = StringArray(self.staged.list_files())  # flat: the list itself copies no page

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: int) -> int:
        return len(self.staged.read(self.names[i]))


@pytest.mark.slow  # ~30-60 s on the 2-core VM: 30,000 files staged by two workers
def test_workers_staging_an_epoch_hold_no_copy_of_the_manifest(tmp_path):
    """Each worker's private memory (USS) over the epoch that stages 30,000 files: a byte bound. When each
    worker read the others' records into a table of its own, each grew by 45 MB here (torch's loader)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from scale_memory import make_tiny_tree, measure_worker_uss_growth

    base = Path("/dev/shm") if os.path.isdir("/dev/shm") else tmp_path  # tmpfs: 30,000 unlinks cost nothing
    work = Path(tempfile.mkdtemp(prefix="coordl-test-staging-", dir=base))
    try:
        root = make_tiny_tree(str(work / "src"), 30_000, classes=10, size_bytes=0)
        growth = measure_worker_uss_growth(
            lambda: _Staging(root, str(work / "stage")), torch.utils.data.DataLoader, 2
        )
        assert growth.items == 30_001  # and the tree's marker file
        assert (work / "stage" / ".coordl" / "manifest.log").read_bytes().count(b"\n") == 30_001
        assert growth.max_growth_bytes < 4 << 20, [round(b / 2**20, 1) for b in growth.growth_bytes]
    finally:
        shutil.rmtree(work, ignore_errors=True)

"""nfs_cache.entries.StagedEntries: the manifest's entries held flat read as the dict they were, before and after
compaction, and a large manifest read back costs no per-file objects."""

from __future__ import annotations

import random

from nfs_cache.entries import Entry, StagedEntries
from nfs_cache.manifest import Manifest


def _check(entries: StagedEntries, want: dict[str, Entry]) -> None:
    assert len(entries) == len(want) and sorted(entries) == sorted(want)
    assert dict(entries.items()) == want and entries.total_bytes == sum(e.size for e in want.values())
    for rel, entry in want.items():
        assert rel in entries and entries.get(rel) == entry and entries[rel] == entry
    assert "absent" not in entries and entries.get("absent") is None and entries.get(0) is None  # type: ignore[arg-type]


def test_reads_as_the_dict_of_its_records_through_compactions() -> None:
    rng = random.Random(0)
    entries, want = StagedEntries(), {}
    names = [f"c{rng.randrange(50)}/{rng.randrange(10**6):07d} ü.jpg" for _ in range(3000)]
    for step, rel in enumerate(names * 4):
        if rng.random() < 0.2:
            entries.apply(rel, None)
            want.pop(rel, None)
        else:
            entry = Entry(rng.randrange(1 << 20), rng.randrange(1 << 62), rng.randrange(1 << 32))
            entries.apply(rel, entry)
            want[rel] = entry
        if step % 997 == 0:
            _check(entries, want)
            entries.settle()
    _check(entries, want)
    entries.compact()
    assert not entries._delta
    _check(entries, want)


def test_a_large_manifest_is_held_in_arrays(tmp_path) -> None:
    path = str(tmp_path / "manifest.log")
    writer = Manifest(path)
    for i in range(20_000):  # what 20,000 staged files leave behind
        writer._append(f"+ {i} {i * 7} {i:08x} d/{i:06d}.jpg")
    writer.remove("d/000003.jpg")
    reader = Manifest(path)
    reader.refresh()
    assert len(reader.entries) == 19_999 and reader.get("d/000003.jpg") is None
    assert reader.get("d/012345.jpg") == Entry(12345, 12345 * 7, 12345)
    assert reader.total_bytes == sum(range(20_000)) - 3
    assert not reader.entries._delta  # merged into the arrays once, after the read
    writer.close()
    reader.close()

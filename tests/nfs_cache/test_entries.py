"""nfs_cache.entries: records held flat (a stage's listing) read as the dicts they were, before and after
compaction. (The manifest's entries: tests/nfs_cache/test_index.py.)"""

from __future__ import annotations

import pickle
import random

from nfs_cache.entries import Entry, FlatRecords, RemoteFiles
from nfs_cache.sources import RemoteFile


class Entries(FlatRecords[Entry]):
    """Records of three fields, as the manifest's entries were held before its shared index."""

    FIELDS = ("size", "mtime_ns", "crc32")

    def _record(self, name: str, row: list[int]) -> Entry:
        return Entry(*row)


def _check(entries: Entries, want: dict[str, Entry]) -> None:
    assert len(entries) == len(want) and sorted(entries) == sorted(want)
    assert dict(entries.items()) == want and entries.total_bytes == sum(e.size for e in want.values())
    for rel, entry in want.items():
        assert rel in entries and entries.get(rel) == entry and entries[rel] == entry
    assert "absent" not in entries and entries.get("absent") is None and entries.get(0) is None  # type: ignore[arg-type]


def test_reads_as_the_dict_of_its_records_through_compactions() -> None:
    rng = random.Random(0)
    entries, want = Entries(), {}
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


def test_remote_files_read_as_the_listing_dict() -> None:
    files = [RemoteFile(f"c{i % 7}/{i:06d}.jpg", i, 1_700_000_000_000_000_000 + i) for i in range(10_000)]
    listing = RemoteFiles()
    listing.update((f.relpath, f) for f in files)  # a long run: merged into the arrays at once
    assert not listing._delta and len(listing) == 10_000 and listing.total_bytes == sum(range(10_000))
    extra = RemoteFile("new/one.jpg", 5, 6)
    listing.update([(extra.relpath, extra)])  # one file, as a copy process adds it
    want = {f.relpath: f for f in [*files, extra]}
    assert dict(listing.items()) == want and sorted(listing.values(), key=lambda f: f.relpath) == sorted(
        want.values(), key=lambda f: f.relpath
    )
    assert listing["c3/000003.jpg"] == files[3] and listing.get("absent") is None and "new/one.jpg" in listing
    assert sorted(listing) == sorted(want)
    back = pickle.loads(pickle.dumps(listing))
    assert dict(back.items()) == want and back.total_bytes == listing.total_bytes

"""coordl.objectstore.listing.Listing: a bucket listing held in flat columns reads as the list of ObjectInfo it was."""

from __future__ import annotations

import pickle

from coordl.objectstore.client import ObjectInfo
from coordl.objectstore.listing import Listing, listing_digest
from shmem.strings import StringArray


def test_reads_as_the_list_of_objects_and_pickles_flat() -> None:
    objects = [
        ObjectInfo(f"train/c{i % 3}/{i:05d} ü.jpg", i * 10, 1_700_000_000_000_000_000 + i, f"e{i:x}")
        for i in range(500)
    ]
    listing = Listing(objects)
    assert len(listing) == 500 and listing == objects and list(listing) == objects
    assert listing[-1] == objects[-1] and listing[10:13] == objects[10:13]
    assert Listing([[o.key, o.size, o.mtime_ns, o.etag] for o in objects]) == objects  # the JSON file's rows
    assert listing_digest(listing) == listing_digest(objects)
    assert isinstance(listing.keys, StringArray) and listing.sizes_mtimes.shape == (500, 2)
    back = pickle.loads(pickle.dumps(listing))
    text_bytes = sum(len(o.key.encode()) + len(o.etag) for o in objects)
    assert (
        back == objects and len(pickle.dumps(listing)) < text_bytes + 32 * 500 + 1024
    )  # offsets, size, mtime
    assert Listing() == [] and len(Listing()) == 0

"""shmem.strings.StringArray: a read-only list of str held as one blob and one offsets array."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from shmem.strings import StringArray

NAMES = ["a/1.jpg", "", "b/ü.png", os.fsdecode(b"c/\xff.jpg"), "d/" + "x" * 300]


def test_reads_back_as_the_list_it_was_made_from() -> None:
    arr = StringArray(NAMES)
    assert len(arr) == len(NAMES) and list(arr) == NAMES
    assert [arr[i] for i in range(-len(NAMES), len(NAMES))] == NAMES + NAMES
    assert arr[np.int64(2)] == "b/ü.png" and arr[1:4] == NAMES[1:4] and arr[::-2] == NAMES[::-2]
    assert arr == NAMES and NAMES == arr and arr != NAMES[:-1] and arr != "a/1.jpg"  # noqa: SIM300 - both sides
    assert "b/ü.png" in arr and arr.index("") == 1
    assert os.fsencode(arr[3]) == b"c/\xff.jpg"  # a name that is not UTF-8 round-trips (surrogateescape)
    with pytest.raises(IndexError, match="out of range"):
        arr[len(NAMES)]
    with pytest.raises(TypeError):
        arr["0"]  # type: ignore[call-overload]


def test_holds_two_objects_and_pickles_as_them() -> None:
    arr = StringArray(f"class_{i % 10}/{i:07d}.jpg" for i in range(10_000))
    text_bytes = sum(len(s) for s in arr)
    assert arr.nbytes == text_bytes + 8 * 10_001
    blob = pickle.dumps(arr, protocol=pickle.HIGHEST_PROTOCOL)
    assert len(blob) < arr.nbytes + 1024  # no per-string overhead in the pickle
    back = pickle.loads(blob)
    assert back == arr and back[9_999] == "class_9/0009999.jpg"
    assert not arr.ends.flags.writeable


def test_from_arrays_checks_the_offsets() -> None:
    arr = StringArray.from_arrays(b"abcde", np.array([0, 2, 2, 5]))
    assert list(arr) == ["ab", "", "cde"]
    for ends in ([0, 2, 6], [1, 5], [0, 3, 2, 5], []):
        with pytest.raises(ValueError, match="do not cut a blob of 5 bytes"):
            StringArray.from_arrays(b"abcde", np.array(ends, dtype=np.int64))
    assert len(StringArray()) == 0 and list(StringArray()) == []


def test_concat_joins_parts_without_decoding_them() -> None:
    parts = [StringArray(["a", "bü"]), ["", "c"], StringArray(), ("d",)]
    joined = StringArray.concat(parts)
    assert joined == ["a", "bü", "", "c", "d"] and joined.ends.tolist() == [0, 1, 4, 4, 5, 6]
    assert StringArray.concat([]) == [] and StringArray.concat([StringArray()]) == []

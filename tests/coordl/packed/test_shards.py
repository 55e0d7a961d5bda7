"""Shard names and shard indexes: brace expansion, one pass over the headers, stale and damaged indexes."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from coordl.packed.shards import (
    NO_LABEL,
    TruncatedShardError,
    build_index,
    expand_braces,
    load_index,
    save_index,
    split_key,
)

EXTS = ("jpg", "png")


def write_shard(path, samples, end_marker=True) -> None:
    """samples: (key, {ext: bytes}); members in the given order, as WebDataset writers do."""
    with open(path, "wb") as f, tarfile.open(fileobj=f, mode="w") as tf:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
        if not end_marker:
            tf.fileobj = io.BytesIO()  # the end-of-archive blocks go nowhere


def test_expand_braces_keeps_padding_and_multiplies_groups():
    assert expand_braces("d/a-{000..002}.tar") == ["d/a-000.tar", "d/a-001.tar", "d/a-002.tar"]
    assert expand_braces("a-{8..10}.tar") == ["a-8.tar", "a-9.tar", "a-10.tar"]
    assert expand_braces("{x,y}-{0..1}") == ["x-0", "x-1", "y-0", "y-1"]
    assert expand_braces("plain.tar") == ["plain.tar"]
    with pytest.raises(ValueError, match="downwards"):
        expand_braces("a-{5..1}.tar")
    with pytest.raises(ValueError, match="neither"):
        expand_braces("a-{5}.tar")


def test_split_key_is_webdataset_rule():
    assert split_key("dir/sub/img.001.jpg") == ("dir/sub/img", "001.jpg")
    assert split_key("x.JPG") == ("x", "jpg")
    assert split_key("a.b/c.cls") == ("a.b/c", "cls")


def test_index_finds_offsets_and_labels(tmp_path):
    shard = str(tmp_path / "s.tar")
    write_shard(shard, [("k0", {"cls": b"2", "jpg": b"AAAA"}), ("k1", {"png": b"BB", "cls": b" 7\n"}),
                        ("k2", {"jpg": b"C"}), ("k3", {"txt": b"not a sample"})])  # fmt: skip
    ix = build_index(shard, EXTS)
    assert ix.keys == ["k0", "k1", "k2"] and ix.exts == ["jpg", "png", "jpg"]
    assert ix.labels.tolist() == [2, 7, NO_LABEL]  # k2 has no .cls: marked, never guessed
    with open(shard, "rb") as f:
        data = f.read()
    got = [data[o : o + s] for o, s in zip(ix.offsets.tolist(), ix.sizes.tolist(), strict=True)]
    assert got == [b"AAAA", b"BB", b"C"]


def test_index_roundtrip_and_staleness(tmp_path):
    shard = str(tmp_path / "s.tar")
    write_shard(shard, [("a", {"cls": b"1", "jpg": b"xyz"})])
    ix = build_index(shard, EXTS)
    save_index(ix, shard + ".idx", EXTS)
    st = os.stat(shard)
    with open(shard + ".idx", "rb") as f:
        raw = f.read()
    back = load_index(raw, st.st_size, st.st_mtime_ns, EXTS)
    assert back is not None and back.keys == ["a"] and back.labels.tolist() == [1]
    assert load_index(raw, st.st_size, st.st_mtime_ns + 1, EXTS) is None  # shard rewritten
    assert load_index(raw, st.st_size + 512, st.st_mtime_ns, EXTS) is None  # shard grew
    assert load_index(raw, st.st_size, st.st_mtime_ns, ("png",)) is None  # other extensions
    assert load_index(raw[: len(raw) // 2], st.st_size, st.st_mtime_ns, EXTS) is None  # damaged index
    assert [n for n in os.listdir(tmp_path) if ".tmp" in n] == []


def test_truncated_shard_names_member_and_offset(tmp_path):
    shard = str(tmp_path / "s.tar")
    write_shard(shard, [("a", {"cls": b"1", "jpg": b"x" * 3000}), ("b", {"cls": b"2", "jpg": b"y" * 3000})])
    whole = os.path.getsize(shard)
    for cut in (whole - 2048 - 100, 1024 + 512 + 3072 + 1024 + 200):  # inside b's data; inside b.cls' header
        with open(shard, "r+b") as f:
            f.truncate(cut)
        with pytest.raises(TruncatedShardError, match=r"s\.tar.*(offset|truncated)"):
            build_index(shard, EXTS)
        partial = build_index(shard, EXTS, keep_partial=True)
        assert partial.keys[:1] == ["a"] and partial.cut
        write_shard(
            shard, [("a", {"cls": b"1", "jpg": b"x" * 3000}), ("b", {"cls": b"2", "jpg": b"y" * 3000})]
        )


def test_missing_end_marker_is_truncation(tmp_path):
    shard = str(tmp_path / "s.tar")
    write_shard(shard, [("a", {"cls": b"1", "jpg": b"x"})], end_marker=False)
    with pytest.raises(TruncatedShardError, match="end-of-archive"):
        build_index(shard, EXTS)

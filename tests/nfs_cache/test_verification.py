"""A staged copy that no longer matches its checksum is never served: it is detected and copied again."""

from __future__ import annotations

from nfs_cache import StagedSource


def test_corrupted_staged_file_is_detected_and_restaged(dataset, tmp_path):
    root, files = dataset
    rel = "class0/img 001.jpg"
    with StagedSource(root, tmp_path / "stage") as staged:
        staged.read(rel)
    local = tmp_path / "stage" / rel
    data = bytearray(local.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one flipped byte: only the checksum can tell
    local.write_bytes(bytes(data))
    with StagedSource(root, tmp_path / "stage") as staged:
        assert staged.read(rel) == files[rel]
        stats = staged.stats()
        assert staged.local_stats()["corrupt_staged"] == 1
        assert stats["remote_bytes_read"] == len(files[rel])
        assert stats["staged_items"] == 1
    assert local.read_bytes() == files[rel]


def test_truncated_or_deleted_staged_file_is_restaged(dataset, tmp_path):
    root, files = dataset
    a, b = "class1/img 000.jpg", "class1/img 001.jpg"
    with StagedSource(root, tmp_path / "stage") as staged:
        staged.read(a)
        staged.read(b)
    (tmp_path / "stage" / a).write_bytes(files[a][:10])
    (tmp_path / "stage" / b).unlink()
    with StagedSource(root, tmp_path / "stage") as staged:
        assert staged.read(a) == files[a]
        assert staged.read(b) == files[b]
        assert staged.stats()["staged_items"] == 2


def test_unverified_mode_still_checks_size(dataset, tmp_path):
    root, files = dataset
    rel = "class2/img 003.jpg"
    with StagedSource(root, tmp_path / "stage", verify=False) as staged:
        staged.read(rel)
        (tmp_path / "stage" / rel).write_bytes(b"short")
        assert staged.read(rel) == files[rel]

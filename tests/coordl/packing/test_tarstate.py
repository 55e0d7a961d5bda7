"""A tar pack's resume state: bytes written per shard do not grow with the shards before it (issue 59 item 4),
and a state file of the earlier one-file format still resumes, or is refused naming the file."""

from __future__ import annotations

import json
import os

import pytest

import coordl
from coordl.packed.tar import TarShards
from coordl.packing import tarstate
from coordl.packing.pack import pack
from coordl.packing.tarstate import SHARD_DIR, STATE_FILE
from tests.coordl.packed.conftest import N_ITEMS


def _writes(monkeypatch) -> list[tuple[str, int]]:
    """(file name, bytes) of every state file written from now on."""
    seen: list[tuple[str, int]] = []
    real = tarstate.write_json

    def counting(path: str, doc: dict) -> None:
        real(path, doc)
        seen.append((os.path.basename(path), os.path.getsize(path)))

    monkeypatch.setattr(tarstate, "write_json", counting)
    return seen


def test_state_bytes_per_shard_are_the_shards_own(image_root, tmp_path, monkeypatch):
    writes = _writes(monkeypatch)
    result = pack(
        coordl.ImageFolder(image_root), str(tmp_path / "out"), "tar", shard_mb=0.004, progress=False
    )
    assert result.ok
    shards = len(os.listdir(tmp_path / "out" / SHARD_DIR))
    assert shards >= 6  # enough shards that a state rewritten after each would show
    headers = [b for name, b in writes if name == STATE_FILE]
    records = {name: b for name, b in writes if name != STATE_FILE}
    assert len(headers) == 2 and max(headers) < 1024  # at the start and at the end, never per shard
    assert len(records) == shards == sum(1 for name, _ in writes if name != STATE_FILE)  # each written once
    for name, size in records.items():  # a shard's own CRCs (base64) and a few fields, whatever came before
        with open(tmp_path / "out" / SHARD_DIR / name) as f:
            count = json.load(f)["count"]
        assert size <= 4 * (4 * count + 2) / 3 + 80, (name, size, count)


def _to_version_1(dst: str, keep_shards: int) -> None:
    """Rewrite ``dst``'s state as an earlier coordl wrote it (one file), as if it was killed after
    ``keep_shards`` shards."""
    with open(os.path.join(dst, STATE_FILE)) as f:
        header = json.load(f)
    names = sorted(os.listdir(os.path.join(dst, SHARD_DIR)))
    records = []
    for name in names[:keep_shards]:
        with open(os.path.join(dst, SHARD_DIR, name)) as f:
            records.append(json.load(f))
    for name in names:
        os.unlink(os.path.join(dst, SHARD_DIR, name))
    os.rmdir(os.path.join(dst, SHARD_DIR))
    header.pop("version")
    header.update(shards=records, complete=False)
    header.pop("classes", None)
    with open(os.path.join(dst, STATE_FILE), "w") as f:
        json.dump(header, f)


def test_an_earlier_one_file_state_resumes(image_root, tmp_path):
    dst = str(tmp_path / "out")
    folder = coordl.ImageFolder(image_root)
    assert pack(folder, dst, "tar", shard_mb=0.004, progress=False).ok
    _to_version_1(dst, keep_shards=3)
    result = pack(folder, dst, "tar", shard_mb=0.004, progress=False)
    assert result.ok and result.verified == N_ITEMS
    assert 0 < result.written_now < N_ITEMS  # the three shards it recorded were kept
    with open(os.path.join(dst, STATE_FILE)) as f:
        assert "shards" not in json.load(f)  # converted
    ds = TarShards(dst)
    assert len(ds) == N_ITEMS and all(ds.fetch(i) == folder.fetch(i) for i in range(N_ITEMS))


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "is not a tar pack's state file"),
        ('{"format": "coordl-tar", "source": "x", "count": 3, "shards": {"a": 1}}', "'shards' is not a list"),
        (
            '{"format": "coordl-tar", "source": "x", "count": 3, "shards": [{"name": "a"}]}',
            "a shard record needs",
        ),
        ('{"format": "coordl-tar", "version": 7, "source": "x", "count": 3}', "state version 7"),
    ],
)
def test_an_unreadable_state_is_refused_naming_the_file(image_root, tmp_path, text, message):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / STATE_FILE).write_text(text)
    with pytest.raises(ValueError, match=message) as err:
        pack(coordl.ImageFolder(image_root), str(dst), "tar", progress=False)
    assert str(dst / STATE_FILE) in str(err.value)

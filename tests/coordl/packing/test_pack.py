"""coordl pack: exit 0 only when every record reads back; a kill -9 resumes; other sources are refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import coordl
from coordl.packed.lmdb import LMDBDataset
from coordl.packed.tar import TarShards
from coordl.packing.pack import main as pack_main
from coordl.packing.pack import pack
from tests.coordl.packed.conftest import N_ITEMS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# A pack that blocks forever at item STOP (after touching a marker file), to be killed there.
_CHILD = textwrap.dedent(
    """
    import sys, time
    import coordl
    import coordl.packing.lmdb as pack_lmdb
    from coordl.packing.pack import pack

    root, dst, fmt, marker, stop = sys.argv[1:6]
    pack_lmdb._LMDB_COMMIT_BYTES = 2000  # commit every record or so: the kill lands between commits

    class Stalls(coordl.ImageFolder):
        def fetch(self, index):
            if index == int(stop):
                open(marker, "w").close()
                time.sleep(600)
            return super().fetch(index)

    pack(Stalls(root), dst, fmt, shard_mb=0.01, progress=False)
    """
)


def _same_as_source(ds, folder, payload=lambda raw, i: raw) -> None:
    assert len(ds) == len(folder) and ds.targets == folder.targets
    assert all(bytes(payload(ds.fetch(i), i)) == folder.fetch(i) for i in range(len(ds)))


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_cli_exits_zero_and_prints_sizes(image_root, tmp_path, capsys, fmt):
    dst = str(tmp_path / "out")
    assert pack_main([image_root, dst, "--format", fmt, "--shard-mb", "0.02", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert f"packed {N_ITEMS} items" in out and f"before: {N_ITEMS} files" in out and "after:" in out
    assert f"verified: all {N_ITEMS} records" in out
    folder = coordl.ImageFolder(image_root)
    if fmt == "lmdb":
        ds = LMDBDataset(dst)
        _same_as_source(ds, folder, ds.payload)
        ds.close()
    else:
        _same_as_source(TarShards(dst), folder)
    # a second run finds the pack complete: it writes nothing and verifies again
    assert pack_main([image_root, dst, "--format", fmt, "--shard-mb", "0.02", "--quiet"]) == 0
    assert "by an earlier run" in capsys.readouterr().out


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_kill_9_then_rerun_resumes(image_root, tmp_path, fmt):
    dst, marker = str(tmp_path / "out"), str(tmp_path / "marker")
    env = {**os.environ, "PYTHONPATH": REPO}
    child = subprocess.Popen([sys.executable, "-c", _CHILD, image_root, dst, fmt, marker, "15"], env=env)
    deadline = time.monotonic() + 120
    while not os.path.exists(marker):
        assert child.poll() is None and time.monotonic() < deadline, (
            "the packing child died or never got there"
        )
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(30)
    if fmt == "tar":
        assert any(n.endswith(".partial") for n in os.listdir(dst))  # it was killed inside a shard
    result = pack(coordl.ImageFolder(image_root), dst, fmt, shard_mb=0.01, progress=False)
    assert result.ok and result.verified == N_ITEMS
    assert 0 < result.written_now < N_ITEMS  # the killed run's committed work was kept
    assert not any(n.endswith(".partial") for n in os.listdir(dst))
    folder = coordl.ImageFolder(image_root)
    if fmt == "lmdb":
        ds = LMDBDataset(dst)
        _same_as_source(ds, folder, ds.payload)
        ds.close()
    else:
        _same_as_source(TarShards(dst), folder)


def test_pack_of_another_source_is_refused(image_root, tmp_path):
    other = coordl.datasets.synth.make_dataset(
        tmp_path / "other", n=6, classes=2, width=32, height=32, workers=1
    )
    for fmt in ("lmdb", "tar"):
        dst = str(tmp_path / fmt)
        assert pack(coordl.ImageFolder(image_root), dst, fmt, progress=False).ok
        with pytest.raises(FileExistsError, match="holds a pack of"):
            pack(coordl.ImageFolder(str(other)), dst, fmt, progress=False)
    assert pack_main([str(other), str(tmp_path / "tar"), "--format", "tar", "--quiet"]) == 2


def test_damage_after_packing_fails_verification(image_root, tmp_path, capsys):
    dst = tmp_path / "shards"
    assert pack_main([image_root, str(dst), "--format", "tar", "--shard-mb", "0.02", "--quiet"]) == 0
    shard = dst / "data-000001.tar"
    data = bytearray(shard.read_bytes())
    data[3000] ^= 0xFF  # inside some member's data: the tar stays readable, one payload is wrong
    shard.write_bytes(bytes(data))
    assert pack_main([image_root, str(dst), "--format", "tar", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "verification FAILED: 1 of" in err and "data-000001.tar:" in err and "CRC32 differs" in err


def test_converts_between_packed_formats(image_root, lmdb_path, tmp_path):
    folder = coordl.ImageFolder(image_root)
    assert pack_main([lmdb_path, str(tmp_path / "shards"), "--format", "tar", "--quiet"]) == 0
    _same_as_source(TarShards(str(tmp_path / "shards")), folder)
    assert pack_main([str(tmp_path / "shards"), str(tmp_path / "back"), "--format", "lmdb", "--quiet"]) == 0
    ds = LMDBDataset(str(tmp_path / "back"))
    _same_as_source(ds, folder, ds.payload)
    ds.close()


def test_bad_arguments(image_root, tmp_path):
    with pytest.raises(ValueError, match="format"):
        pack(coordl.ImageFolder(image_root), str(tmp_path / "x"), "zip")
    with pytest.raises(ValueError, match="shard-mb"):
        pack(coordl.ImageFolder(image_root), str(tmp_path / "x"), "tar", shard_mb=0)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "precious.txt").write_text("not a pack")
    with pytest.raises(FileExistsError, match="not empty"):
        pack(coordl.ImageFolder(image_root), str(tmp_path / "full"), "tar", progress=False)

"""scripts/gpu/dali_install.py: DALI carried in parts over consecutive device calls, joined and unpacked.

A fake package stands in for DALI (the real parts are 150 MB): the parts are made the way
scripts/gpu_dali.sh makes them (tar | xz, split, SHA256 beside each), carried one call at a time
(``stash``), then joined, checked and unpacked into a site folder where a file already there wins.
"""

from __future__ import annotations

import hashlib
import io
import lzma
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from gpu import dali_install  # noqa: E402


def _make_parts(tree: Path, files: dict[str, bytes], n: int) -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo("./" + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    blob = lzma.compress(raw.getvalue())
    size = -(-len(blob) // n)
    for i in range(n):
        (tree / f"p{i}").mkdir(parents=True)
        (tree / f"p{i}" / f"{dali_install.NAME}.{i}").write_bytes(blob[i * size : (i + 1) * size])
        (tree / f"p{i}" / "SHA256").write_text(
            f"{hashlib.sha256(blob).hexdigest()}  {dali_install.NAME} ({n} parts)\n"
        )


@pytest.fixture
def fake(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "nvidia").mkdir(parents=True)
    (site / "nvidia" / "__init__.py").write_text("# the image's own\n")
    monkeypatch.setattr(dali_install.sysconfig, "get_paths", lambda: {"purelib": str(site)})
    monkeypatch.setattr(
        dali_install, "_importable", lambda: (site / "nvidia" / "dali" / "__init__.py").exists()
    )
    files = {
        "nvidia/__init__.py": b"# DALI's\n",
        "nvidia/dali/__init__.py": b"x = 1\n",
        "nvidia/cu13/lib/a.so": b"\0" * 5000,
    }
    return site, files


def _call(tree: Path, part: int, full: Path) -> Path:
    """What one device call's tree holds: only the part it carried."""
    call = tree / f"call{part}"
    (call / f"p{part}").mkdir(parents=True)
    for f in (full / f"p{part}").iterdir():
        (call / f"p{part}" / f.name).write_bytes(f.read_bytes())
    return call


def test_parts_carried_one_call_at_a_time_join_and_unpack(tmp_path, fake):
    site, files = fake
    full, stash = tmp_path / "full", tmp_path / "stash"
    _make_parts(full, files, 3)
    assert "1 of 3" in dali_install.stash(_call(tmp_path, 0, full), stash)
    assert "2 of 3" in dali_install.stash(_call(tmp_path, 1, full), stash)
    line = dali_install.install(_call(tmp_path, 2, full), stash)  # the last call carries the last part
    assert "nvidia.dali imports" in line, line
    assert (site / "nvidia" / "dali" / "__init__.py").read_bytes() == b"x = 1\n"
    assert (site / "nvidia" / "cu13" / "lib" / "a.so").stat().st_size == 5000
    assert (site / "nvidia" / "__init__.py").read_text() == "# the image's own\n"  # a file already there wins
    assert "nothing unpacked" in dali_install.install(tmp_path / "none", stash)


def test_a_missing_part_names_what_is_there(tmp_path, fake):
    site, files = fake
    full, stash = tmp_path / "full", tmp_path / "stash"
    _make_parts(full, files, 3)
    dali_install.stash(_call(tmp_path, 0, full), stash)
    line = dali_install.install(_call(tmp_path, 2, full), stash)
    assert "2 of 3 DALI parts" in line and "have: 0, 2" in line
    assert not (site / "nvidia" / "dali").exists()


def test_a_stale_part_is_refused_not_unpacked(tmp_path, fake):
    site, files = fake
    full, stash = tmp_path / "full", tmp_path / "stash"
    _make_parts(full, files, 2)
    part = full / "p1" / f"{dali_install.NAME}.1"
    part.write_bytes(part.read_bytes()[:-10])  # cut short, as a transfer that broke off
    dali_install.stash(_call(tmp_path, 0, full), stash)
    line = dali_install.install(_call(tmp_path, 1, full), stash)
    assert "do not match their SHA-256" in line
    assert not (site / "nvidia" / "dali").exists()


def test_no_parts_says_how_to_make_them(tmp_path, fake):
    assert "scripts/gpu_dali.sh" in dali_install.install(tmp_path / "none", tmp_path / "stash")

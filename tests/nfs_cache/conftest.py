"""Fixtures for nfs_cache tests: a small generated dataset, and a real NFS export of it (nfs-ganesha)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tests.support.ganesha import GaneshaServer, ganesha_missing_reason


def make_dataset(root: Path, classes: int = 3, per_class: int = 8, seed: int = 0) -> dict[str, bytes]:
    """Write ``classes`` folders of small files with random bytes; return {relpath: bytes}."""
    rng = random.Random(seed)
    files: dict[str, bytes] = {}
    for c in range(classes):
        for i in range(per_class):
            rel = f"class{c}/img {i:03d}.jpg"  # a space, to check path encoding end to end
            data = rng.randbytes(rng.randint(1000, 20000))
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            files[rel] = data
    (root / "class0" / "notes.txt").write_bytes(b"not an image")
    files["class0/notes.txt"] = b"not an image"
    return files


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    root = tmp_path / "remote"
    return root, make_dataset(root)


@pytest.fixture(scope="module")
def nfs_dataset(tmp_path_factory: pytest.TempPathFactory):
    """(server, {relpath: bytes}): a generated dataset exported over NFSv4 on loopback."""
    reason = ganesha_missing_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("export")
    files = make_dataset(root)
    with GaneshaServer(root, tag="nfst") as server:
        yield server, files


class CountingCounters:
    """Stands in for coordl's SharedCounters: ``add(name, amount)`` across processes (a shared-memory int)."""

    def __init__(self) -> None:
        import multiprocessing

        self._value = multiprocessing.get_context("fork").Value("q", 0)

    def add(self, name: str, amount: int = 1) -> None:
        assert name == "remote_bytes_read"
        with self._value.get_lock():
            self._value.value += amount

    @property
    def remote_bytes_read(self) -> int:
        return int(self._value.value)


@pytest.fixture
def tmpfs_dir(tmp_path: Path):
    """A 1 MiB tmpfs mount (a stage disk that fills up); skipped without root."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    import subprocess

    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True, timeout=10)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, timeout=10)

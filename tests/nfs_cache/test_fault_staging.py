"""Faults while staging a dataset to local disk (``coordl stage`` / ``nfs_cache.StagedSource``).

Promises: a full disk never leaves a half-written file where a user or a reader can see it, and the
command says so clearly; ``kill -9`` in the middle of staging, then a re-run, gives a tree identical
byte for byte to the source without copying again what was complete; a staged file corrupted on disk
is caught by its checksum and fetched again.

Only public interfaces are used (``StagedSource.local_path``, ``read``, ``stats``, the CLI), so these
tests hold whether the stage directory keeps its bookkeeping beside the data (``DST/files``,
``DST/tmp``, ``DST/manifest.log``) or mirrors the source with bookkeeping in a hidden ``DST/.coordl``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nfs_cache import StagedSource

ROOT = Path(__file__).resolve().parents[2]
# Files the flat layout keeps visible beside the data; never a copy in progress (its tmp/ must be empty).
_FLAT_BOOKKEEPING = {"manifest.log", "source.txt"}


def _write_tree(root: Path, n: int, size: int, seed: int) -> dict[str, bytes]:
    rng = random.Random(seed)
    files = {}
    for i in range(n):
        rel = f"part{i % 3}/item {i:03d}.bin"
        data = rng.randbytes(size + rng.randint(0, 4096))
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        files[rel] = data
    return files


def _visible_files(dst: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(dst):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        out += [Path(dirpath) / f for f in sorted(filenames) if not f.startswith(".")]
    return out


def _assert_nothing_half_written(src: Path, dst: Path, files: dict[str, bytes]) -> int:
    """Every file a user can see under ``dst`` is a complete copy (or flat-layout bookkeeping).

    Returns how many complete copies are visible.
    """
    with StagedSource(src, dst) as staged:
        where = {os.path.realpath(staged.local_path(rel)): rel for rel in files}
    complete = 0
    for path in _visible_files(dst):
        rel = where.get(os.path.realpath(path))
        if rel is not None:
            assert path.read_bytes() == files[rel], f"{path}: visible but not a complete copy of {rel}"
            complete += 1
            continue
        name = path.relative_to(dst).as_posix()
        assert name in _FLAT_BOOKKEEPING or name.startswith("locks/"), f"{path}: a stray visible file"
    return complete


def _stage_cli(src: Path, dst: Path, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "nfs_cache.cli", str(src), str(dst), "--no-progress", *extra],
        capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip


# -- disk full ---------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_disk_full_while_staging_leaves_nothing_half_written(tmp_path: Path, tmpfs_dir: Path) -> None:
    src = tmp_path / "src"
    files = _write_tree(src, 6, 300_000, seed=1)  # 1.8 MB into 1 MiB: the 4th copy hits ENOSPC
    dst = tmpfs_dir / "stage"
    # min_free_bytes=None: no head room kept, so the copies run into ENOSPC mid-write.
    with StagedSource(src, dst, min_free_bytes=None) as staged:
        for rel in staged.list_files():
            assert staged.read(rel) == files[rel]  # reads go on, from the remote
        assert "disk full" in staged.staging_stopped
        staged_items = staged.stats()["staged_items"]
    assert 0 < staged_items < len(files)
    assert _assert_nothing_half_written(src, dst, files) == staged_items
    with StagedSource(src, dst) as staged:  # a later run serves what was recorded, from the disk
        remote = [r for r in files if not staged.is_staged(r)]
        for rel in files:
            assert staged.read(rel) == files[rel]
        assert staged.stats()["remote_bytes_read"] == sum(len(files[r]) for r in remote)


@pytest.mark.timeout(120)
def test_stage_command_reports_a_full_disk(tmp_path: Path, tmpfs_dir: Path) -> None:
    src = tmp_path / "src"
    files = _write_tree(src, 6, 300_000, seed=2)
    dst = tmpfs_dir / "stage"
    done = _stage_cli(src, dst)
    assert _assert_nothing_half_written(src, dst, files) < len(files)
    assert done.returncode != 0, done.stdout
    assert str(dst) in done.stderr and ("disk" in done.stderr or "free" in done.stderr), done.stderr


# -- kill -9 while staging, then resume ----------------------------------------------------------------

_PARKED_STAGE = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {root!r})
    from nfs_cache import stage_all
    from nfs_cache.sources import LocalSource

    class Parked(LocalSource):
        # Reading the k-th file signals the test and waits to be killed: staging is mid-dataset.
        def read(self, relpath):
            if relpath == sys.argv[3]:
                open(sys.argv[4], "w").close()
                time.sleep(600)
            return super().read(relpath)

    stage_all(Parked(sys.argv[1]), sys.argv[2], progress=False)
    """
)


@pytest.mark.timeout(180)
def test_kill9_while_staging_then_resume_is_byte_identical(tmp_path: Path) -> None:
    src, dst, marker = tmp_path / "src", tmp_path / "stage", tmp_path / "parked"
    files = _write_tree(src, 30, 50_000, seed=3)
    order = sorted(files)
    k = 17  # files 0..16 are staged when the 18th read parks
    proc = subprocess.Popen(
        [sys.executable, "-c", _PARKED_STAGE.format(root=str(ROOT)), str(src), str(dst), order[k], str(marker)],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "staging never reached the parked file"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert _assert_nothing_half_written(src, dst, files) == k
    done = _stage_cli(src, dst, "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["already_files"] == k and summary["staged_files"] == len(files) - k  # none re-copied
    assert summary["staged_bytes"] == sum(len(files[r]) for r in order[k:])
    assert _assert_nothing_half_written(src, dst, files) == len(files)  # every file, byte-identical


def _count_present(paths: list[str]) -> int:
    return sum(os.path.exists(p) for p in paths)


def _start_stage(src: Path, dst: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "nfs_cache.cli", str(src), str(dst), "--no-progress"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def _wait_for_progress(proc: subprocess.Popen, paths: list[str], before: int) -> None:
    """Until one more copy is in place than ``before`` (or the run ends): staging is under way."""
    deadline = time.monotonic() + 60
    while _count_present(paths) <= before and proc.poll() is None:
        assert time.monotonic() < deadline, "staging made no progress in 60 s"
        time.sleep(0.001)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kill9_at_random_moments_then_resume_is_byte_identical(tmp_path: Path) -> None:
    """The real command killed at five seeded moments while it copies: wherever a kill lands (reading,
    writing, renaming, recording), nothing half-written shows and the next run completes the tree."""
    src, dst, scratch = tmp_path / "src", tmp_path / "stage", tmp_path / "scratch"
    files = _write_tree(src, 200, 200_000, seed=4)
    with StagedSource(src, scratch) as staged:
        scratch_paths = [staged.local_path(r) for r in sorted(files)]
    with StagedSource(src, dst) as staged:
        paths = [staged.local_path(r) for r in sorted(files)]
    # How long copying lasts on this machine now, from the first copy in place to the end.
    proc = _start_stage(src, scratch)
    _wait_for_progress(proc, scratch_paths, 0)
    t0 = time.monotonic()
    assert proc.wait(timeout=120) == 0
    window_s = time.monotonic() - t0
    rng = random.Random(4)
    for _ in range(5):
        proc = _start_stage(src, dst)
        _wait_for_progress(proc, paths, _count_present(paths))
        time.sleep(rng.uniform(0.0, 0.5) * window_s)  # where it lands varies; the assertions hold for any
        proc.kill()
        proc.wait(timeout=30)
        _assert_nothing_half_written(src, dst, files)
    done = _stage_cli(src, dst, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["unstaged_files"] == 0
    assert _assert_nothing_half_written(src, dst, files) == len(files)


# -- a staged file corrupted on disk -------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_corrupted_staged_file_is_caught_and_fetched_again(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "stage"
    files = _write_tree(src, 9, 20_000, seed=5)
    done = _stage_cli(src, dst)
    assert done.returncode == 0, done.stderr
    victim = sorted(files)[4]
    with StagedSource(src, dst) as staged:
        local = Path(staged.local_path(victim))
    data = bytearray(local.read_bytes())
    data[len(data) // 2] ^= 0x01  # same size, one bit: only the checksum can tell
    local.write_bytes(bytes(data))
    with StagedSource(src, dst) as staged:
        for rel in sorted(files):
            assert staged.read(rel) == files[rel]  # never the corrupt bytes
        assert staged.local_stats()["corrupt_staged"] == 1
        assert staged.stats()["remote_bytes_read"] == len(files[victim])  # only that one re-fetched
    assert local.read_bytes() == files[victim]  # and repaired on disk
    assert _assert_nothing_half_written(src, dst, files) == len(files)

"""``reclaim_stale`` removes a segment once the processes it names are gone, and not before.

A loader worker's batch ring is named for the main process too (``reader=``): killed, the worker may still
have batches in torch's queue that the main process maps later, so another process's reclaim must leave
the segment while the main process lives.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from shmem.segment import SEGMENT_NAME_RE, Segment, owner_tag, reclaim_stale

ROOT = Path(__file__).resolve().parents[2]


def made_by_a_dead_process(directory: Path, reader: str | None) -> Path:
    """Create a segment in a child process killed right after (no cleanup runs); its path."""
    code = (
        "import os, sys\n"
        "from shmem.segment import Segment\n"
        f"s = Segment.create('ring', 4096, {str(directory)!r}, reader={reader!r})\n"
        "print(s.path, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == -9, proc.stderr
    return Path(proc.stdout.strip())


def test_a_dead_owners_segment_is_reclaimed(tmp_path: Path) -> None:
    path = made_by_a_dead_process(tmp_path, reader=None)
    assert path.exists()
    assert reclaim_stale(tmp_path) == [str(path)]
    assert not path.exists()


def test_a_segment_for_a_live_reader_stays_after_its_owner_dies(tmp_path: Path) -> None:
    path = made_by_a_dead_process(tmp_path, reader=owner_tag())  # this process reads it
    m = SEGMENT_NAME_RE.match(path.name)
    assert m is not None and (m["kind"], int(m["rpid"])) == ("ring", os.getpid())
    assert reclaim_stale(tmp_path) == []
    Segment.create("other", 4096, tmp_path)  # every create reclaims first
    assert path.exists()


def test_a_segment_whose_owner_and_reader_are_dead_is_reclaimed(tmp_path: Path) -> None:
    reader = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        path = made_by_a_dead_process(tmp_path, reader=owner_tag(reader.pid))
        assert reclaim_stale(tmp_path) == []
    finally:
        reader.kill()
        reader.wait()
    assert reclaim_stale(tmp_path) == [str(path)]


def _in_new_pid_namespace(code: str) -> subprocess.Popen | None:
    """``code`` run by Python as pid 1 of a new pid namespace (``unshare``), or None where not allowed."""
    import shutil

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return None
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    if probe.returncode != 0:
        return None
    return subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def test_a_live_owner_in_another_pid_namespace_is_never_reclaimed(tmp_path) -> None:
    # Containers run with --ipc=host share /dev/shm but not pids: seen from here, the other container's
    # owner (pid 1 of its namespace) is another process, and its live segment looked stale.
    import pytest

    code = (
        "import sys\n"
        "from shmem.segment import Segment\n"
        f"s = Segment.create('minio', 4096, {str(tmp_path)!r})\n"
        "print(s.path, flush=True)\n"
        "sys.stdin.read()\n"  # alive until the test closes its stdin
    )
    proc = _in_new_pid_namespace(code)
    if proc is None:
        pytest.skip("needs root and unshare --pid (a new pid namespace)")
    try:
        path = proc.stdout.readline().strip()
        m = SEGMENT_NAME_RE.match(os.path.basename(path))
        assert m is not None and int(m["pid"]) == 1  # its pid in its own namespace
        assert reclaim_stale(tmp_path) == [] and os.path.exists(path)
        Segment.create("minio", 4096, tmp_path).close()  # a create here reclaims first, too
        assert os.path.exists(path)
    finally:
        proc.stdin.close()
        proc.wait(30)
    assert not os.path.exists(path)  # its owner closed it at exit, as ever

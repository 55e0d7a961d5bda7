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
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
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

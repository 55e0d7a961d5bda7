"""shmem.segment: segments are reclaimed after their owner dies, and a full file system is not a bus error."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap

import pytest

from shmem import segment as shm


def test_owner_unlinks_on_close(tmp_path):
    seg = shm.Segment.create("t", 4096, tmp_path)
    assert os.path.exists(seg.path)
    seg.close()
    assert not os.path.exists(seg.path)


def test_attached_copy_does_not_unlink(tmp_path):
    seg = shm.Segment.create("t", 4096, tmp_path)
    other = pickle.loads(pickle.dumps(seg))
    other.buf[:5] = b"hello"
    assert bytes(seg.buf[:5]) == b"hello"
    other.close()
    assert os.path.exists(seg.path)
    seg.close()


def test_kind_is_validated(tmp_path):
    with pytest.raises(ValueError, match="kind"):
        shm.Segment.create("Bad-Kind", 16, tmp_path)


def test_stale_segment_of_killed_owner_is_reclaimed(tmp_path):
    code = textwrap.dedent(
        f"""
        import os, time
        from shmem.segment import Segment
        seg = Segment.create("t", 1 << 20, {str(tmp_path)!r})
        print(seg.path, flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    path = proc.stdout.readline().strip()
    assert os.path.exists(path)
    assert shm.reclaim_stale(tmp_path) == []  # owner alive: kept
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert os.path.exists(path)  # kill -9 ran no cleanup
    assert shm.reclaim_stale(tmp_path) == [path]
    assert not os.path.exists(path)


def test_reserve_reports_full_instead_of_sigbus(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)]).returncode
    ):
        pytest.skip("needs root to mount a small tmpfs")
    try:
        seg = shm.Segment.create("t", 8 << 20, mnt)  # sparse: larger than the file system
        assert seg.reserve(0, 512 << 10)
        assert not seg.reserve(512 << 10, 4 << 20)
        seg.close()
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_forked_child_running_the_inherited_finalizer_does_not_unlink(tmp_path):
    import multiprocessing as mp

    seg = shm.Segment.create("t", 4096, tmp_path)

    def child() -> None:
        seg._finalizer()  # what garbage collection or atexit would run in the child
        os._exit(0)

    p = mp.get_context("fork").Process(target=child)
    p.start()
    p.join(10)
    assert p.exitcode == 0
    assert os.path.exists(seg.path)
    seg.close()
    assert not os.path.exists(seg.path)

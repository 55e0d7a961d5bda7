"""Over a throttled link (ganesha in a network namespace behind tc tbf): kill -9 of ``coordl stage`` mid-way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from nfs_cache import StagedSource
from tests.support.ganesha import GaneshaServer, ganesha_missing_reason

pytestmark = [pytest.mark.nfs, pytest.mark.netns, pytest.mark.slow]


def test_kill_9_of_coordl_stage_then_rerun(tmp_path):
    reason = ganesha_missing_reason(netns=True)
    if reason:
        pytest.skip(reason)
    export = tmp_path / "export"
    files = {f"d{i % 4}/f{i:03d}.bin": os.urandom(200_000) for i in range(40)}  # 8 MB over 40 mbit: ~2 s
    for rel, data in files.items():
        (export / rel).parent.mkdir(parents=True, exist_ok=True)
        (export / rel).write_bytes(data)
    stage = tmp_path / "stage"
    with GaneshaServer(export, netns=True, rate="40mbit", tag="nfsk") as server:
        cmd = [sys.executable, "-m", "nfs_cache.cli", server.url(), str(stage), "--no-progress"]
        proc = subprocess.Popen(cmd, start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            manifest = stage / ".coordl" / "manifest.log"
            while time.monotonic() < deadline:
                if manifest.exists() and manifest.read_bytes().count(b"\n") >= 8:
                    break
                time.sleep(0.05)
            os.killpg(proc.pid, signal.SIGKILL)  # the CLI and its copy processes, mid-way
            proc.wait(10)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        with StagedSource(server.url(), stage) as staged:
            done = staged.stats()["staged_items"]
            assert 8 <= done < len(files)
            for rel in staged.manifest.entries:  # every recorded copy is complete
                assert (stage / rel).read_bytes() == files[rel]
        rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert rerun.returncode == 0, rerun.stderr
        assert f"{done} were already staged" in rerun.stdout
    for rel, data in files.items():
        assert (stage / rel).read_bytes() == data
    assert os.listdir(stage / ".coordl" / "tmp") == []

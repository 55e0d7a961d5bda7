"""The benchmarks' slow storage (``benchmarks/slowstore.py``) undoes itself when its run is killed.

A benchmark stopped with SIGTERM (``kill``, ``timeout``, a CI job cancelled) used to leave its ext4 file
system mounted, its loop device held and its cgroups behind, with the interrupted child still inside. Needs
root, cgroup v1 ``memory`` and ``blkio``, and loop devices: skipped elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0
    or not all(os.path.isdir(f"/sys/fs/cgroup/{c}") for c in ("memory", "blkio"))
    or shutil.which("losetup") is None
    or shutil.which("mkfs.ext4") is None,
    reason="needs root, cgroup v1 memory and blkio, losetup and mkfs.ext4",
)

# Makes a small store, starts a child inside its cgroups, says where everything is, then waits to be killed.
_RUN = """
import json, subprocess, sys, time
sys.path.insert(0, {benchmarks!r})
from slowstore import SlowStore
with SlowStore(image_bytes=32 << 20, read_bps=None, page_cache_bytes=None, tag="test") as store:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             preexec_fn=lambda: [open(p, "w").write("0") for p in store.cgroup_procs_paths()])
    print(json.dumps({{"mount": store.mount, "loop": store.loop, "name": store.name, "child": child.pid}}), flush=True)
    time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_killed_run_unmounts_detaches_and_removes_its_cgroups(sig):
    proc = subprocess.Popen(
        [sys.executable, "-c", _RUN.format(benchmarks=str(BENCHMARKS))], stdout=subprocess.PIPE, text=True
    )
    try:
        where = json.loads(proc.stdout.readline())
        with open("/proc/mounts") as f:
            assert where["mount"] in f.read()
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 128 + sig
    finally:
        if proc.poll() is None:
            proc.kill()
    with open("/proc/mounts") as f:
        assert where["mount"] not in f.read()
    assert not os.path.exists(f"/sys/block/{os.path.basename(where['loop'])}/loop/backing_file")
    for ctl in ("memory", "blkio"):
        assert not os.path.isdir(f"/sys/fs/cgroup/{ctl}/{where['name']}")
    assert not _alive(where["child"])
    assert not os.path.exists(os.path.dirname(where["mount"]))

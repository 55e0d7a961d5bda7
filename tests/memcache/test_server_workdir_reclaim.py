"""A Redis started with ``die_with_parent`` whose starter is SIGKILLed leaves no workdir (with its 0600
redis.conf, which holds the password) behind for good: the next such start removes it.

Found by the soak (benchmarks/soak, docs/reliability.md "Soak"): every SIGKILLed rank of a partitioned
job left a ``memcache-redis-*`` directory in the temp directory; an hour of faults left dozens.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from memcache.server import start_redis

pytestmark = pytest.mark.redis

CHILD = """
import sys, time
from memcache.server import start_redis
s = start_redis(16 << 20, password="pw-of-the-killed-job", die_with_parent=True)
print(s.workdir, s.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(120)
def test_workdir_of_a_killed_starter_is_reclaimed_by_the_next_start(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True, env=env)
    try:
        workdir, redis_pid = child.stdout.readline().split()  # type: ignore[union-attr]
    finally:
        child.kill()
        child.wait(30)
    deadline = time.monotonic() + 30
    while psutil.pid_exists(int(redis_pid)) and time.monotonic() < deadline:
        time.sleep(0.05)  # the server dies with its starter (PR_SET_PDEATHSIG)
    assert Path(workdir).is_dir() and "pw-of-the-killed-job" in (Path(workdir) / "redis.conf").read_text()

    live = start_redis(16 << 20, die_with_parent=True)  # a live owner's workdir is kept
    try:
        assert not Path(workdir).exists()
        assert Path(live.workdir).is_dir()
        other = start_redis(16 << 20, die_with_parent=True)
        assert Path(live.workdir).is_dir()
        other.stop()
    finally:
        live.stop()
    assert not os.listdir(tmp_path)

"""Two real ranks on loopback (gloo), each a subprocess "node" (LOCAL_WORLD_SIZE=1), for the partitioned
cache's tests: run a script on both with per-rank environments, read back each rank's RESULT line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

__all__ = ["run_two_ranks", "results", "JOB_SECRET"]

# A random-looking secret the tests give both ranks (COORDL_PEER_SECRET): TLS with the job's own CA
# across nodes needs one. Its value must never show in a command line, a log or an error.
JOB_SECRET = "7f3a9c1e5b2d4f6081a3c5e7092b4d6f"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_ranks(tmp_path: Path, envs: list[dict], text: str) -> list[tuple[int, str, str]]:
    """``(returncode, stdout, stderr)`` of each rank running ``text``; ``COORDL_PEER_*``/``MEMCACHE_*``
    of this process are not passed on (each rank gets only ``envs[rank]`` of them)."""
    script = tmp_path / "rank.py"
    script.write_text(text)
    port = _free_port()
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("COORDL_PEER", "MEMCACHE_"))}
        env.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0",
            LOCAL_WORLD_SIZE="1", GROUP_RANK=str(rank), COORDL_PEER_ADDR="127.0.0.1", **envs[rank],
        )  # fmt: skip
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = [p.communicate(timeout=180) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs, strict=True)]


def results(runs: list[tuple[int, str, str]]) -> list[dict]:
    """Each rank's ``RESULT {json}`` line, after checking that it exited 0."""
    found = []
    for rc, out, err in runs:
        assert rc == 0, err[-3000:]
        found.append(json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT"))[7:]))
    return found

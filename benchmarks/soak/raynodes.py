"""The soak's local Ray cluster: a head and one prep node, real ``ray start --block`` processes.

Both run in a network namespace of their own that has only ``lo`` (``cdlsoak-ray-<pid>``), with the
``ray`` job that drives them: Ray 2.x advertises the machine's first interface address even when told
``--node-ip-address 127.0.0.1`` (tests/coordl/remote/ray_cluster.py), and in such a namespace 127.0.0.1
is the only address it can find. Each is as small as Ray allows on the 2-core host: the head with
``--num-cpus 0`` (no actor lands there), the prep node with ``--num-cpus 1``, 80 MiB object stores, no
dashboard, no usage stats, every file under the soak's run directory, token authentication on (the
token travels in the environment, never on a command line). The health checks are short, so a killed
node is declared dead in about five seconds.

:meth:`RayNodes.kill_node` SIGKILLs the prep node's every process (``ray start``, raylet, its agents
and workers, the actor among them), as a machine failure would; :meth:`RayNodes.restart_node` starts it
again. :meth:`RayNodes.stop` kills both nodes' process trees (never ``ray stop``, which would stop
every Ray on the machine) and deletes the namespace.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RAY = str(Path(sys.executable).parent / "ray")
STORE_BYTES = 80 << 20  # Ray's smallest object store is 75 MiB
SETTINGS = {  # Ray system settings read by every Ray process started with them
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "2000",
    "RAY_health_check_failure_threshold": "5",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def skip_reason() -> str | None:
    """Why the Ray job cannot run here, or None."""
    if not Path(RAY).exists():
        return "Ray is not installed (pip install 'coordl[ray]')"
    from tests.support.netns import skip_reason as netns_reason

    reason = netns_reason()
    return f"the Ray cluster's loopback namespace: {reason}" if reason else None


class RayNodes:
    """Head and prep node in their namespace; ``host`` starts the ``ray`` job in it too."""

    def __init__(self, rundir: Path) -> None:
        from tests.support.netns import Host

        self.dir = rundir / "ray"
        self.dir.mkdir()
        self.netns = f"cdlsoak-ray-{os.getpid()}"
        subprocess.run(["ip", "netns", "add", self.netns], check=True, capture_output=True, timeout=20)
        subprocess.run(["ip", "-n", self.netns, "link", "set", "lo", "up"], check=True, timeout=20)
        self.host = Host(name="ray", netns=self.netns, ip="127.0.0.1", ifname="lo")
        self.port = self.host.free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.token = secrets.token_hex(16)
        self.env = {
            **SETTINGS,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
            "PYTHONPATH": f"{ROOT}:{HERE}",
        }  # fmt: skip  (the actors unpickle items.Items)
        self.head: subprocess.Popen | None = None
        self.node: subprocess.Popen | None = None
        self.node_starts = 0

    def job_env(self) -> dict[str, str]:
        """What the ``ray`` job needs to connect (its token in the environment)."""
        return {k: v for k, v in self.env.items() if k != "PYTHONPATH"}

    def _start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = self.dir / f"{name}.log"
        cmd = [RAY, "start", *args, "--node-ip-address", "127.0.0.1", "--object-store-memory", str(STORE_BYTES),
               "--block", "--disable-usage-stats", "--temp-dir", str(self.dir / name)]  # fmt: skip
        with open(log, "ab") as out:
            proc = self.host.popen(
                cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # `ray start --block` prints this once its processes are up
            if b"Ray runtime started" in log.read_bytes():
                return proc
            if proc.poll() is not None:
                break
            time.sleep(0.5)
        raise RuntimeError(f"the Ray {name} did not start: {log.read_text(errors='replace')[-2000:]}")

    def start(self) -> None:
        self.head = self._start("head", ["--head", "--port", str(self.port), "--num-cpus", "0",
                                         "--include-dashboard=false"])  # fmt: skip
        self.restart_node()

    def restart_node(self) -> None:
        self.node = self._start("node", ["--address", self.address, "--num-cpus", "1"])
        self.node_starts += 1

    def kill_node(self) -> list[int]:
        """SIGKILL the prep node's every process; returns their pids."""
        return _kill_tree(self.node)

    def trees(self) -> dict[str, list[psutil.Process]]:
        """The head's and the prep node's processes (for the monitor and the clean-up check)."""
        return {name: _tree(p) for name, p in (("ray-head", self.head), ("ray-node", self.node))}

    def stop(self) -> None:
        _kill_tree(self.node)
        _kill_tree(self.head)
        res = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True, timeout=20)
        for pid in res.stdout.split():  # anything still in the namespace is the soak's own
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ValueError, ProcessLookupError):
                pass
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True, timeout=20)


def _tree(proc: subprocess.Popen | None) -> list[psutil.Process]:
    if proc is None:
        return []
    try:
        p = psutil.Process(proc.pid)
        return [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _kill_tree(proc: subprocess.Popen | None) -> list[int]:
    """SIGKILL ``ray start``'s session and every process below it (Ray gives some their own groups)."""
    if proc is None:
        return []
    pids = [p.pid for p in _tree(proc)]
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    return pids

"""A real Ray cluster on this machine for the remote-prep tests: separate ``ray start`` processes.

The head is the trainer's node (``--num-cpus 0``: no actor lands there); each prep node is a
``ray start --address ... --num-cpus 1 --block`` process in a session of its own, pinned with
``taskset`` to one core where the machine has more than one, so killing its process group kills that
node (raylet, agents and its actors) as a machine failure would. Token authentication is on (Ray's
``RAY_AUTH_MODE=token``), the dashboard off, every temp dir under /tmp, and the health checks short so
that a killed node is declared dead in about five seconds instead of fifteen (shorter, a loaded
machine's live nodes were declared dead too).

The whole cluster, and this process as its driver, lives in a network namespace of its own that has only a
loopback interface (:class:`LoopbackNamespace`): Ray 2.x advertises the machine's first interface address
even when told ``--node-ip-address 127.0.0.1``, and in such a namespace the only address it can find is
127.0.0.1, so no byte of the tests leaves loopback. Needs root and ``ip`` (the tests skip otherwise).
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RAY = str(Path(sys.executable).parent / "ray")

# Ray system settings (RAY_<name> environment variables), read by every Ray process started with them.
FAST_FAILURE = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "2000",
    "RAY_health_check_failure_threshold": "5",
    "RAY_USAGE_STATS_ENABLED": "0",
}


CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


class LoopbackNamespace:
    """A network namespace with only ``lo`` (up), entered by the calling thread; processes and threads it
    starts afterwards are in it too. :meth:`leave` returns the thread to where it was and deletes it."""

    def __init__(self) -> None:
        self.name = f"coordl-ray-{os.getpid()}-{secrets.token_hex(3)}"
        subprocess.run(["ip", "netns", "add", self.name], check=True, capture_output=True, timeout=20)
        subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "up"], check=True, timeout=20)
        self._home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        fd = os.open(f"/run/netns/{self.name}", os.O_RDONLY)
        try:
            _setns(fd)
        finally:
            os.close(fd)

    def leave(self) -> None:
        _setns(self._home)
        os.close(self._home)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=20)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """One ``ray start --block`` process group."""

    def __init__(self, proc: subprocess.Popen, name: str, log: Path) -> None:
        self.proc, self.name, self.log = proc, name, log

    def kill(self) -> None:
        """SIGKILL the node's every process: its process group, and every descendant of ``ray start``
        (Ray puts the processes it starts, actors included, in process groups of their own)."""
        victims = _descendants(self.proc.pid)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class RayCluster:
    """Head plus prep nodes; :meth:`stop` kills every process group it started."""

    def __init__(self) -> None:
        self.netns = LoopbackNamespace()
        self.dir = Path(tempfile.mkdtemp(prefix="coordl_ray_", dir="/tmp"))
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.token = secrets.token_hex(16)
        self.nodes: list[Node] = []
        self.env = {
            **os.environ,
            **FAST_FAILURE,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
            "PYTHONPATH": str(ROOT),
        }

    def _start(self, name: str, args: list[str], cores: str | None) -> Node:
        log = self.dir / f"{name}.log"
        cmd = [RAY, "start", *args, "--block", "--disable-usage-stats", "--temp-dir", str(self.dir / name)]
        if cores is not None and shutil.which("taskset") and (os.cpu_count() or 1) > 1:
            cmd = ["taskset", "-c", cores, *cmd]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        node = Node(proc, name, log)
        self.nodes.append(node)
        return node

    def start_head(self) -> None:
        self._start(
            "head",
            ["--head", "--node-ip-address", "127.0.0.1", "--port", str(self.port), "--num-cpus", "0",
             "--include-dashboard=false", "--object-store-memory", str(200 << 20)],
            cores="0",
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.nodes[0].proc.poll() is not None:
                    break
                time.sleep(0.2)
        raise RuntimeError(f"the Ray head did not start: {self.nodes[0].log.read_text()[-2000:]}")

    def add_node(self, resources: str | None = None, cores: str = "1") -> Node:
        """A prep node of one CPU; waits until the cluster counts it (needs this process connected)."""
        import ray

        # by id, not by count: a node an earlier test killed may still count as alive, then drop out
        before = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        args = [
            "--address",
            self.address,
            "--node-ip-address",
            "127.0.0.1",
            "--num-cpus",
            "1",
            "--object-store-memory",
            str(100 << 20),
        ]
        if resources:
            args += ["--resources", resources]
        node = self._start(f"node{len(self.nodes)}", args, cores=cores)
        deadline = time.monotonic() + 120
        while not {n["NodeID"] for n in ray.nodes() if n["Alive"]} - before:
            if node.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"a Ray node did not join: {node.log.read_text()[-2000:]}")
            time.sleep(0.3)
        return node

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.netns.leave()

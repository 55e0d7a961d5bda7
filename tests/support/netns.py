"""Emulated multi-node networks on one machine: network namespaces, veth pairs, a bridge, tc rate limits.

Tests and benchmarks of distributed features (partitioned cache, gradient compression) need nodes
with their own network identity and, often, a slow link between them. :class:`VirtualNetwork`
builds that from Linux primitives::

    switch namespace  [ br0 ]--p0 ... p<n-1>
                               |        |          (veth pairs, optional tc tbf on both ends)
    host namespaces      veth0 (h0)  veth0 (h<n-1>)   10.<x>.<y>.<i+1>/24, lo up

Each network takes a /24 subnet that no other live coordl network holds (chosen under a file lock and
recorded in the namespace names), so concurrent networks of different helpers and pids never collide.
Teardown removes everything even after errors; :func:`cleanup_stale` removes what a killed run left.

Gloo inside a namespace must be told which interface to use: see :meth:`VirtualNetwork.dist_env`.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shmem.segment import owner_alive, start_ticks

__all__ = ["Host", "VirtualNetwork", "cleanup_stale", "skip_reason"]

_LOCK_PATH = "/run/lock/coordl-netns.lock"
_NETNS_DIR = "/run/netns"
_HOST_IFNAME = "veth0"
_BRIDGE = "br0"
_CMD_TIMEOUT_S = 20.0
# <prefix>-<pid>-<start>-<x>-<y>-<role>; the owner's pid and start time let cleanup_stale spot dead owners.
_NAME_RE = re.compile(
    r"^(?P<prefix>[a-z0-9]+)-(?P<pid>\d+)-(?P<start>\d+)-(?P<x>\d+)-(?P<y>\d+)-(?P<role>sw|h\d+)$"
)


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``ip`` (inside ``netns`` when given); errors carry the command and ip's message."""
    argv = ["ip", *args] if netns is None else ["ip", "-n", netns, *args]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=_CMD_TIMEOUT_S)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed (rc {res.returncode}): {res.stderr.strip()}")
    return res


def _tc(netns: str, *args: str) -> None:
    argv = ["ip", "netns", "exec", netns, "tc", *args]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=_CMD_TIMEOUT_S)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed (rc {res.returncode}): {res.stderr.strip()}")


def _list_netns() -> list[str]:
    try:
        return sorted(os.listdir(_NETNS_DIR))
    except FileNotFoundError:
        return []


_skip_cache: list[str | None] = []


def skip_reason() -> str | None:
    """Why virtual networks cannot be built here (for ``pytest.skip``), or None when they can.

    Checks root, ``ip``/``tc`` on PATH, and actually creates and deletes a throw-away namespace with a
    veth pair (some containers forbid that even to root). The answer is cached per process.
    """
    if _skip_cache:
        return _skip_cache[0]
    reason: str | None = None
    if os.geteuid() != 0:
        reason = "network namespaces need root"
    elif shutil.which("ip") is None or shutil.which("tc") is None:
        reason = "iproute2 (ip, tc) is not installed: run scripts/setup.sh"
    else:
        probe = f"cdlprobe-{os.getpid()}-{start_ticks(os.getpid())}-0-0-sw"
        try:
            _ip("netns", "add", probe)
            _ip("link", "add", "a0", "type", "veth", "peer", "name", "b0", netns=probe)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            reason = f"this machine forbids network namespaces or veth pairs: {exc}"
        finally:
            _ip("netns", "del", probe, check=False)
    _skip_cache.append(reason)
    return reason


def _kill_netns_pids(netns: str) -> None:
    """SIGKILL what still runs inside one of *our* namespaces, so that deleting it frees it for real."""
    res = _ip("netns", "pids", netns, check=False)
    for tok in res.stdout.split():
        try:
            os.kill(int(tok), signal.SIGKILL)
        except (ValueError, ProcessLookupError):
            pass


def _delete_netns(names: Sequence[str]) -> None:
    for name in names:
        _kill_netns_pids(name)
    for name in names:
        # Deleting a namespace destroys its interfaces; a veth pair dies with either end.
        _ip("netns", "del", name, check=False)


def cleanup_stale(prefix: str = "cdl") -> list[str]:
    """Delete namespaces named ``<prefix>-...`` whose creating process is gone (a killed run's leftovers).

    Returns the names deleted. Namespaces of live owners are left alone.
    """
    stale = []
    for name in _list_netns():
        m = _NAME_RE.match(name)
        if m and m["prefix"] == prefix and not owner_alive(int(m["pid"]), int(m["start"])):
            stale.append(name)
    _delete_netns(stale)
    return stale


@dataclass
class Host:
    """One emulated node: a network namespace with one interface ``ifname`` at address ``ip``."""

    name: str
    netns: str
    ip: str
    ifname: str
    _procs: list[subprocess.Popen] = field(default_factory=list, repr=False)

    def _argv(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *map(str, argv)]

    @staticmethod
    def _env(env: Mapping[str, str] | None) -> dict[str, str]:
        merged = dict(os.environ)
        if env:
            merged.update({k: str(v) for k, v in env.items()})
        return merged

    def popen(self, argv: Sequence[str], env: Mapping[str, str] | None = None, **kw: Any) -> subprocess.Popen:
        """Start ``argv`` inside this host's namespace. ``env`` is *added to* the current environment.

        The process is killed at network teardown if it still runs.
        """
        proc = subprocess.Popen(self._argv(argv), env=self._env(env), **kw)
        self._procs.append(proc)
        return proc

    def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        timeout: float = 60.0,
        check: bool = True,
        **kw: Any,
    ) -> subprocess.CompletedProcess:
        """Run ``argv`` inside this host's namespace to completion (``subprocess.run`` semantics)."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(self._argv(argv), env=self._env(env), timeout=timeout, check=check, **kw)

    def free_port(self) -> int:
        """A TCP port that is free inside this namespace, picked by the OS (bind to port 0)."""
        code = "import socket; s=socket.socket(); s.bind(('0.0.0.0',0)); print(s.getsockname()[1])"
        res = self.run([_python(), "-c", code], timeout=30)
        return int(res.stdout.strip())


def _python() -> str:
    import sys

    return sys.executable


class VirtualNetwork:
    """``n_hosts`` namespaces joined by a bridge, optionally rate-limited; a context manager.

    Args:
        n_hosts: number of emulated nodes (1..250).
        rate_mbit: when given, each host link is limited to this rate in both directions (tc tbf).
        prefix: namespace-name prefix (lowercase letters/digits), so that helpers can tell theirs apart.

    ``hosts[i]`` has address ``10.<x>.<y>.<i+1>``; the subnet is unique among live coordl networks.
    """

    def __init__(self, n_hosts: int, *, rate_mbit: float | None = None, prefix: str = "cdl") -> None:
        if not 1 <= n_hosts <= 250:
            raise ValueError(f"n_hosts must be in 1..250, got {n_hosts}")
        if not re.fullmatch(r"[a-z0-9]+", prefix):
            raise ValueError(f"prefix must be lowercase letters/digits, got {prefix!r}")
        if rate_mbit is not None and rate_mbit <= 0:
            raise ValueError(f"rate_mbit must be > 0, got {rate_mbit}")
        self.n_hosts = n_hosts
        self.rate_mbit = rate_mbit
        self.prefix = prefix
        self.hosts: list[Host] = []
        self.switch: str | None = None
        self.subnet: str | None = None
        self._names: list[str] = []

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> VirtualNetwork:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> VirtualNetwork:
        """Create the namespaces, links and limits. On any failure everything made so far is removed."""
        reason = skip_reason()
        if reason:
            raise RuntimeError(f"cannot build a virtual network: {reason}")
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        me = os.getpid()
        base = f"{self.prefix}-{me}-{start_ticks(me)}"
        os.makedirs(os.path.dirname(_LOCK_PATH), exist_ok=True)
        with open(_LOCK_PATH, "a+") as lock:
            # The lock makes "pick a free subnet, claim it by creating the switch namespace" atomic.
            fcntl.flock(lock, fcntl.LOCK_EX)
            x, y = self._free_subnet(base)
            self.subnet = f"10.{x}.{y}.0/24"
            self.switch = f"{base}-{x}-{y}-sw"
            self._names.append(self.switch)
            _ip("netns", "add", self.switch)
        sw = self.switch
        _ip("link", "set", "lo", "up", netns=sw)
        _ip("link", "add", _BRIDGE, "type", "bridge", netns=sw)
        _ip("link", "set", _BRIDGE, "up", netns=sw)
        for i in range(self.n_hosts):
            ns = f"{base}-{x}-{y}-h{i}"
            self._names.append(ns)
            _ip("netns", "add", ns)
            port = f"p{i}"
            # Create both ends directly inside their namespaces: no name can clash in the root namespace.
            _ip("link", "add", _HOST_IFNAME, "netns", ns, "type", "veth", "peer", "name", port, "netns", sw)
            _ip("link", "set", port, "master", _BRIDGE, "up", netns=sw)
            ip = f"10.{x}.{y}.{i + 1}"
            _ip("addr", "add", f"{ip}/24", "dev", _HOST_IFNAME, netns=ns)
            _ip("link", "set", _HOST_IFNAME, "up", netns=ns)
            _ip("link", "set", "lo", "up", netns=ns)
            if self.rate_mbit is not None:
                self._limit(ns, _HOST_IFNAME)  # host -> switch
                self._limit(sw, port)  # switch -> host
            self.hosts.append(Host(name=f"h{i}", netns=ns, ip=ip, ifname=_HOST_IFNAME))

    def _limit(self, netns: str, dev: str, rate_mbit: float | None = None) -> None:
        rate_mbit = self.rate_mbit if rate_mbit is None else rate_mbit
        assert rate_mbit is not None
        rate_bytes_per_s = rate_mbit * 1e6 / 8
        # burst >= the largest packet (veth GSO segments reach 64 KiB) or tbf drops everything;
        # ~5 ms of traffic above that keeps the long-run rate close to the target.
        burst = max(65536 + 1514, int(rate_bytes_per_s * 0.005))
        _tc(netns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_mbit}mbit",
            "burst", str(burst), "latency", "100ms")  # fmt: skip

    def set_rate(self, host: int, rate_mbit: float | None) -> None:
        """Change host ``host``'s link rate (both directions); None removes its limit.

        For a slow storage server next to fast nodes: ``VirtualNetwork(3, rate_mbit=1000)``, then
        ``set_rate(2, 100)``.
        """
        ns, port = self.hosts[host].netns, f"p{host}"
        if rate_mbit is None:
            for netns, dev in ((ns, _HOST_IFNAME), (self.switch, port)):
                _ip("netns", "exec", netns, "tc", "qdisc", "del", "dev", dev, "root", check=False)
            return
        if rate_mbit <= 0:
            raise ValueError(f"rate_mbit must be > 0, got {rate_mbit}")
        self._limit(ns, _HOST_IFNAME, rate_mbit)
        self._limit(self.switch, port, rate_mbit)

    def _free_subnet(self, base: str) -> tuple[int, int]:
        used = set()
        for name in _list_netns():
            m = _NAME_RE.match(name)
            if m:
                used.add((int(m["x"]), int(m["y"])))
        # Start from a hash of the owner so different runs spread out, then walk to the next free one.
        h = int.from_bytes(hashlib.sha1(f"{base}-{time.time_ns()}".encode()).digest()[:4], "big")
        slots = 100 * 256  # 10.100.0.0 .. 10.199.255.0: away from common private ranges
        for k in range(slots):
            s = (h + k) % slots
            xy = (100 + s // 256, s % 256)
            if xy not in used:
                return xy
        raise RuntimeError("no free 10.x.y.0/24 subnet left for a virtual network")

    def close(self) -> None:
        """Kill processes started through the hosts, delete every namespace (idempotent, never raises)."""
        for host in self.hosts:
            for proc in host._procs:
                if proc.poll() is None:
                    proc.kill()
                    try:
                        proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        pass
        _delete_netns(list(reversed(self._names)))
        self._names.clear()

    # -- helpers for distributed jobs ------------------------------------------------------------
    def dist_env(
        self,
        rank: int,
        world_size: int | None = None,
        master_port: int | None = None,
        ranks_per_host: int = 1,
    ) -> dict:
        """torch.distributed env for rank ``rank``, which runs on ``hosts[rank // ranks_per_host]``.

        Sets ``GLOO_SOCKET_IFNAME`` (gloo otherwise picks an interface from the hostname, which resolves
        outside the namespace), ``MASTER_ADDR`` = host 0's address, and the torchrun variables of a node
        with ``ranks_per_host`` ranks (``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` = host index).
        Ranks on one host reach each other over that namespace's own address (loopback: not rate-limited).
        """
        if ranks_per_host < 1:
            raise ValueError(f"ranks_per_host must be >= 1, got {ranks_per_host}")
        world = self.n_hosts * ranks_per_host if world_size is None else world_size
        host = rank // ranks_per_host
        env = {
            "GLOO_SOCKET_IFNAME": self.hosts[host].ifname,
            "MASTER_ADDR": self.hosts[0].ip,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank % ranks_per_host),
            "LOCAL_WORLD_SIZE": str(ranks_per_host),
            "GROUP_RANK": str(host),
            "NODE_RANK": str(host),
        }
        if master_port is not None:
            env["MASTER_PORT"] = str(master_port)
        return env

    def __repr__(self) -> str:
        return f"VirtualNetwork(n_hosts={self.n_hosts}, rate_mbit={self.rate_mbit}, subnet={self.subnet})"

"""A throw-away user-space NFS server (nfs-ganesha, VFS backend) exporting one directory, for tests and benchmarks.

NFSv4 only: v4 needs no MOUNT protocol and hence no rpcbind (only one rpcbind can run per machine, and ganesha
exits when v3 cannot register with it). The port is chosen free, never 2049, so several servers can run at once.

Two placements:

* loopback (default): the server listens on 127.0.0.1 in the current network namespace.
* ``netns=True``: the server runs in a new network namespace joined to this one by a veth pair, and an optional
  ``rate`` (``"100mbit"``) puts a ``tc tbf`` shaper on the server's side of the link, so reads from the client
  (which stays in the root namespace) cross a slow link. Needs root and iproute2; removed again by ``stop``.

Usage::

    with GaneshaServer("/path/to/dataset", netns=True, rate="100mbit") as srv:
        url = srv.url()          # nfs://10.213.x.2/export?version=4&nfsport=N
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import time
import warnings

__all__ = ["GaneshaServer", "GaneshaUnavailable", "ganesha_missing_reason"]

_counter = itertools.count()
_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")


class GaneshaUnavailable(RuntimeError):
    """nfs-ganesha (or root, or iproute2 for a namespace) is missing on this machine."""


def ganesha_missing_reason(netns: bool = False) -> str:
    """Why a ``GaneshaServer`` cannot start here ("" when it can): tests skip with this text."""
    if shutil.which("ganesha.nfsd") is None:
        return "nfs-ganesha is not installed: run scripts/setup.sh (apt nfs-ganesha nfs-ganesha-vfs)"
    if not any(os.path.exists(os.path.join(d, "ganesha", "libfsalvfs.so")) for d in _LIB_DIRS):
        return "the nfs-ganesha VFS backend is not installed: apt install nfs-ganesha-vfs"
    if os.geteuid() != 0:
        return "nfs-ganesha needs root (it exports with root-owned credentials)"
    try:
        with warnings.catch_warnings():  # the binding's SWIG wrapper imports the deprecated ``imp``
            warnings.simplefilter("ignore", DeprecationWarning)
            import libnfs  # noqa: F401
    except ImportError:
        return "the libnfs Python binding is missing: pip install 'coordl[nfs]' (needs apt libnfs-dev)"
    if netns and shutil.which("ip") is None:
        return "network namespaces need iproute2 (apt install iproute2)"
    return ""


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _run(cmd: list[str], timeout_s: float = 20.0) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (rc {res.returncode}): {res.stderr.strip()}")


def _used_ipv4() -> set[str]:
    out = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, timeout=10).stdout
    return {f.split("/")[0] for line in out.splitlines() for f in line.split() if "/" in f and "." in f}


class GaneshaServer:
    """Start/stop nfs-ganesha exporting ``export_dir`` (pseudo path ``/export``); a context manager."""

    def __init__(
        self,
        export_dir: str | os.PathLike,
        *,
        netns: bool = False,
        rate: str | None = None,
        tag: str = "nfs",
        start_timeout_s: float = 30.0,
    ) -> None:
        if rate is not None and not netns:
            raise ValueError("rate= shapes the link to a namespace: pass netns=True as well")
        self.export_dir = os.path.abspath(os.fspath(export_dir))
        self.netns = netns
        self.rate = rate
        self.tag = tag
        self.start_timeout_s = start_timeout_s
        self.host = "127.0.0.1"
        self.port = 0
        self.ns_name = ""
        self.veth_host = ""
        self.veth_ns = ""
        self.workdir = ""
        self._proc: subprocess.Popen | None = None

    # -- public ------------------------------------------------------------------------------------------------------

    def url(self, subpath: str = "") -> str:
        """``nfs://`` URL of ``subpath`` (relative to the exported directory) for libnfs / ``NfsSource``."""
        sub = "/" + subpath.strip("/") if subpath.strip("/") else ""
        return f"nfs://{self.host}/export{sub}?version=4&nfsport={self.port}"

    def start(self) -> GaneshaServer:
        reason = ganesha_missing_reason(self.netns)
        if reason:
            raise GaneshaUnavailable(reason)
        self.workdir = tempfile.mkdtemp(prefix=f"{self.tag}-ganesha-")
        try:
            prefix: list[str] = []
            if self.netns:
                self._make_netns()
                prefix = ["ip", "netns", "exec", self.ns_name]
                self.port = 20000 + (
                    os.getpid() % 20000
                )  # the namespace is ours alone: any port is free there
            else:
                self.port = _free_port()
            conf = os.path.join(self.workdir, "ganesha.conf")
            with open(conf, "w") as f:
                f.write(self._config())
            log = os.path.join(self.workdir, "ganesha.log")
            cmd = prefix + [
                "ganesha.nfsd",
                "-F",
                "-f",
                conf,
                "-L",
                log,
                "-p",
                os.path.join(self.workdir, "pid"),
            ]
            self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self._wait_ready(log)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove the namespace and the work directory."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(15)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait(5)
            self._proc = None
        if self.ns_name:
            # Deleting the namespace also deletes its end of the veth pair, and with it the host end.
            with contextlib.suppress(Exception):
                _run(["ip", "netns", "del", self.ns_name])
            with contextlib.suppress(Exception):
                subprocess.run(["ip", "link", "del", self.veth_host], capture_output=True, timeout=10)
            self.ns_name = ""
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = ""

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(os.path.join(self.workdir, "ganesha.log"), errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> GaneshaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals ---------------------------------------------------------------------------------------------------

    def _config(self) -> str:
        recovery = os.path.join(self.workdir, "recovery")
        os.makedirs(recovery, exist_ok=True)
        return f"""
NFS_CORE_PARAM {{ NFS_Port = {self.port}; Bind_Addr = {self.host}; Protocols = 4;
                 Enable_NLM = false; Enable_RQUOTA = false; }}
NFSV4 {{ Graceless = true; RecoveryRoot = {recovery}; }}
EXPORT {{ Export_Id = 1; Path = {self.export_dir}; Pseudo = /export; Protocols = 4; Transports = TCP;
         Access_Type = RW; Squash = No_Root_Squash; SecType = sys; FSAL {{ Name = VFS; }} }}
LOG {{ Default_Log_Level = EVENT; }}
"""

    def _make_netns(self) -> None:
        n = next(_counter)
        self.ns_name = f"{self.tag}{os.getpid()}-{n}"
        short = f"{os.getpid() % 100000}{n % 10}"  # interface names are limited to 15 characters
        self.veth_host, self.veth_ns = f"{self.tag}h{short}", f"{self.tag}n{short}"
        used = _used_ipv4()
        base = next(
            (
                f"10.213.{b}.{c}"
                for b in range(256)
                for c in range(0, 256, 4)
                if f"10.213.{b}.{c + 1}" not in used
            ),
            None,
        )
        if base is None:
            raise RuntimeError("no free 10.213.x.y/30 subnet for the NFS namespace")
        prefix = base.rsplit(".", 1)[0]
        last = int(base.rsplit(".", 1)[1])
        host_ip, ns_ip = f"{prefix}.{last + 1}", f"{prefix}.{last + 2}"
        _run(["ip", "netns", "add", self.ns_name])
        _run(["ip", "link", "add", self.veth_host, "type", "veth", "peer", "name", self.veth_ns])
        _run(["ip", "link", "set", self.veth_ns, "netns", self.ns_name])
        _run(["ip", "addr", "add", f"{host_ip}/30", "dev", self.veth_host])
        _run(["ip", "link", "set", self.veth_host, "up"])
        inside = ["ip", "netns", "exec", self.ns_name]
        _run(inside + ["ip", "addr", "add", f"{ns_ip}/30", "dev", self.veth_ns])
        _run(inside + ["ip", "link", "set", self.veth_ns, "up"])
        _run(inside + ["ip", "link", "set", "lo", "up"])
        if self.rate:
            # Shape what the server sends (the data the client reads). Burst must exceed one (GSO) packet.
            _run(inside + ["tc", "qdisc", "add", "dev", self.veth_ns, "root", "tbf", "rate", self.rate]
                 + ["burst", "256kb", "latency", "50ms"])  # fmt: skip
        self.host = ns_ip

    def _wait_ready(self, log: str) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"ganesha.nfsd exited (rc {self._proc.returncode}):\n{self.log_tail()}")
            try:
                with open(log, errors="replace") as f:
                    ready = "NFS SERVER INITIALIZED" in f.read()
            except OSError:
                ready = False
            if ready:
                try:
                    with socket.create_connection((self.host, self.port), timeout=1.0):
                        return
                except OSError:
                    pass
            time.sleep(0.1)
        raise TimeoutError(f"ganesha.nfsd on {self.host}:{self.port} not ready after {self.start_timeout_s} s:\n"
                           f"{self.log_tail()}")  # fmt: skip

"""A throw-away S3-compatible server for tests and benchmarks: moto's standalone server, with real SigV4 auth.

Why moto (``moto[server]`` from PyPI): it is an HTTP server speaking the S3 REST API (ListObjectsV2, ranged
GET, multipart, error codes) that installs with pip alone, starts in about a second, needs no disk layout, and
checks signatures against IAM users when asked (``INITIAL_NO_AUTH_ACTION_COUNT``), so wrong credentials fail
as on AWS. MinIO's server is not on PyPI or in Debian (its binary download is out of reach here), and Ceph's
radosgw needs a whole Ceph cluster (monitors, OSDs) before it serves one bucket. moto is pure Python: it serves
a few hundred requests per second per core, more than the 100 Mbit/s links the benchmarks emulate need.

Placements:

* loopback (default): the server listens on 127.0.0.1.
* ``netns=True``: the server runs in a new network namespace joined to this one by a veth pair; ``rate``
  (``"100mbit"``) puts a ``tc tbf`` shaper on the server's side, so what clients read crosses a slow link.
* ``delay_ms``: a :mod:`tests.support.delayproxy` in front of the server adds that one-way delay in each
  direction (this kernel has no ``netem``), so a request pays ``2 * delay_ms`` of round trip.

Usage::

    with S3Server(netns=True, rate="100mbit", delay_ms=10) as srv:
        srv.create_bucket("data"); srv.upload_dir(local_dir, "data", "train")
        coordl.ImageFolder("s3://data/train", storage_options=srv.storage_options())
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.support.ganesha import _free_port, _run, _used_ipv4

__all__ = ["S3Server", "s3server_missing_reason"]

_counter = itertools.count()
_DELAY_PROXY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "delayproxy.py")
REGION = "us-east-1"
# The requests the fixture makes without credentials before moto starts checking them: create the IAM user,
# give it a policy, make its access key.
_SETUP_REQUESTS = 3
_ALLOW_ALL = json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
)


def s3server_missing_reason(netns: bool = False) -> str:
    """Why an ``S3Server`` cannot start here ("" when it can): tests skip with this text."""
    try:
        import boto3  # noqa: F401
        import moto.server  # noqa: F401
    except ImportError:
        return (
            "moto[server] and boto3 are not installed: pip install 'coordl[s3,dev]' (scripts/setup.sh does)"
        )
    if netns and (os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None):
        return "a network namespace needs root, iproute2 and tc"
    return ""


class S3Server:
    """Start/stop a moto S3 server (with an IAM user whose keys sign every request); a context manager."""

    def __init__(
        self,
        *,
        netns: bool = False,
        rate: str | None = None,
        delay_ms: float = 0.0,
        tag: str = "s3",
        start_timeout_s: float = 60.0,
        stats_file: str | None = None,
        auth: bool = True,
    ) -> None:
        if rate is not None and not netns:
            raise ValueError("rate= shapes the link to a namespace: pass netns=True as well")
        self.netns, self.rate, self.delay_ms, self.tag = netns, rate, delay_ms, tag
        self.start_timeout_s = start_timeout_s
        self.stats_file = stats_file  # with delay_ms: the proxy's request/byte counts (delayproxy.py)
        # auth=False: any keys are accepted. Checking SigV4 against IAM halves moto's requests per CPU second
        # (measured 150 vs 300 GET/s), CPU that a benchmark on a small machine would take from the loaders.
        self.auth = auth
        self.host, self.port = "127.0.0.1", 0
        self.ns_name = self.veth_host = ""
        self.access_key = self.secret_key = ""
        self._server: subprocess.Popen | None = None
        self._proxy: subprocess.Popen | None = None
        self._server_addr = ("127.0.0.1", 0)

    # -- public --------------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def storage_options(self, **override: Any) -> dict[str, Any]:
        """What coordl's ``storage_options=`` needs to reach this server with the fixture's user."""
        opts = {
            "endpoint_url": self.endpoint, "aws_access_key_id": self.access_key,
            "aws_secret_access_key": self.secret_key, "region_name": REGION,
        }  # fmt: skip
        opts.update(override)
        return opts

    def env(self) -> dict[str, str]:
        """The same as environment variables (``AWS_ENDPOINT_URL`` etc.), for a child process."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_DEFAULT_REGION": REGION,
        }  # fmt: skip

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key, region_name=REGION,
            config=Config(max_pool_connections=16, retries={"max_attempts": 8, "mode": "standard"}),
        )  # fmt: skip

    def pids(self) -> list[int]:
        """The server's and the delay proxy's process ids (a benchmark reads their CPU use from /proc)."""
        return [p.pid for p in (self._server, self._proxy) if p is not None]

    def create_bucket(self, bucket: str) -> None:
        self.client().create_bucket(Bucket=bucket)

    def upload_dir(
        self, local_dir: str | os.PathLike, bucket: str, prefix: str = "", threads: int = 8
    ) -> int:
        """Upload every file under ``local_dir`` to ``bucket/prefix/<relpath>``; returns the count."""
        root = os.fspath(local_dir)
        files = [os.path.join(d, n) for d, _, names in os.walk(root) for n in names if not n.startswith(".")]
        client = self.client()

        def put(path: str) -> None:
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            with open(path, "rb") as f:
                client.put_object(Bucket=bucket, Key=f"{prefix.strip('/')}/{rel}".lstrip("/"), Body=f.read())

        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(put, files))
        return len(files)

    def start(self) -> S3Server:
        reason = s3server_missing_reason(self.netns)
        if reason:
            raise RuntimeError(reason)
        try:
            prefix: list[str] = []
            if self.netns:
                self._make_netns()
                prefix = ["ip", "netns", "exec", self.ns_name]
            self._start_server(prefix)
            if self.auth:
                self._make_user()
            else:
                self.access_key, self.secret_key = "any", "any"
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self) -> None:
        """SIGKILL the server (a crash, as far as clients can tell); the namespace and proxy stay."""
        for proc in (self._server, self._proxy):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)

    def stop(self) -> None:
        """Stop the server and the proxy, and remove the namespace."""
        for proc in (self._proxy, self._server):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        self._server = self._proxy = None
        if self.ns_name:
            with contextlib.suppress(Exception):
                _run(["ip", "netns", "del", self.ns_name])
            with contextlib.suppress(Exception):
                subprocess.run(["ip", "link", "del", self.veth_host], capture_output=True, timeout=10)
            self.ns_name = ""

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals -----------------------------------------------------------------------------------

    def _start_server(self, prefix: list[str]) -> None:
        inner_host = "127.0.0.1" if (self.delay_ms or not self.netns) else self.host
        inner_port = 20000 + os.getpid() % 20000 if self.netns else _free_port()
        env = dict(os.environ)
        if self.auth:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(_SETUP_REQUESTS)
        self._server = subprocess.Popen(
            prefix + [sys.executable, "-m", "moto.server", "-H", inner_host, "-p", str(inner_port)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self._server_addr = (inner_host, inner_port)
        if self.delay_ms:
            outer_port = inner_port + 1 if self.netns else _free_port()
            self._proxy = subprocess.Popen(
                prefix + [sys.executable, _DELAY_PROXY, "--listen", f"{self.host}:{outer_port}",
                          "--to", f"{inner_host}:{inner_port}", "--delay-ms", str(self.delay_ms)]
                + (["--stats-file", self.stats_file] if self.stats_file else []),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            self.port = outer_port
        else:
            self.port = inner_port
        self._wait_ready()

    def _wait_ready(self) -> None:
        import urllib.request

        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            for proc in (self._server, self._proxy):
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"the S3 server or its proxy exited (rc {proc.returncode})")
            try:  # moto answers /moto-api/ without consuming one of the unauthenticated setup requests
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/data.json", timeout=2):
                    return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"S3 server on {self.endpoint} not ready after {self.start_timeout_s} s")

    def _make_user(self) -> None:
        import boto3

        iam = boto3.client("iam", endpoint_url=self.endpoint, region_name=REGION,
                           aws_access_key_id="setup", aws_secret_access_key="setup")  # fmt: skip
        user = f"coordl-{next(_counter)}"
        iam.create_user(UserName=user)
        iam.put_user_policy(UserName=user, PolicyName="all", PolicyDocument=_ALLOW_ALL)
        key = iam.create_access_key(UserName=user)["AccessKey"]
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]

    def _make_netns(self) -> None:
        n = next(_counter)
        self.ns_name = f"{self.tag}{os.getpid()}-{n}"
        short = f"{os.getpid() % 100000}{n % 10}"  # interface names are limited to 15 characters
        self.veth_host, veth_ns = f"{self.tag}h{short}", f"{self.tag}n{short}"
        used = _used_ipv4()
        base = next(
            (
                f"10.214.{b}.{c}"
                for b in range(256)
                for c in range(0, 256, 4)
                if f"10.214.{b}.{c + 1}" not in used
            ),
            None,
        )
        if base is None:
            raise RuntimeError("no free 10.214.x.y/30 subnet for the S3 namespace")
        net, last = base.rsplit(".", 1)
        host_ip, ns_ip = f"{net}.{int(last) + 1}", f"{net}.{int(last) + 2}"
        inside = ["ip", "netns", "exec", self.ns_name]
        _run(["ip", "netns", "add", self.ns_name])
        _run(["ip", "link", "add", self.veth_host, "type", "veth", "peer", "name", veth_ns])
        _run(["ip", "link", "set", veth_ns, "netns", self.ns_name])
        _run(["ip", "addr", "add", f"{host_ip}/30", "dev", self.veth_host])
        _run(["ip", "link", "set", self.veth_host, "up"])
        _run(inside + ["ip", "addr", "add", f"{ns_ip}/30", "dev", veth_ns])
        _run(inside + ["ip", "link", "set", veth_ns, "up"])
        _run(inside + ["ip", "link", "set", "lo", "up"])
        if self.rate:  # shape what the server sends (what clients read); burst above one GSO packet
            _run(inside + ["tc", "qdisc", "add", "dev", veth_ns, "root", "tbf", "rate", self.rate,
                           "burst", "256kb", "latency", "50ms"])  # fmt: skip
        self.host = ns_ip

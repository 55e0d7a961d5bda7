"""VirtualNetwork: hosts in separate namespaces can talk, a rate limit limits, teardown leaves nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.netns import VirtualNetwork, cleanup_stale, skip_reason

pytestmark = pytest.mark.netns

# A sink: accept one connection, read until EOF, reply with the byte count and the seconds it took.
_SINK = """
import socket, sys, time
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
s.settimeout(30); c, _ = s.accept(); c.settimeout(30)
n = 0; t0 = None
while True:
    b = c.recv(1 << 16)
    if t0 is None: t0 = time.perf_counter()
    if not b: break
    n += len(b)
c.sendall(f"{n} {time.perf_counter() - t0:.6f}".encode()); c.close()
"""

_SOURCE = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
buf = b"x" * (1 << 16); left = int(sys.argv[3])
while left > 0:
    c.sendall(buf[: min(left, len(buf))]); left -= len(buf)
c.shutdown(socket.SHUT_WR)
print(c.recv(100).decode())
"""


@pytest.fixture(autouse=True)
def _needs_netns() -> None:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)


def _send(net: VirtualNetwork, nbytes: int) -> tuple[int, float]:
    h0, h1 = net.hosts[0], net.hosts[1]
    sink = h1.popen([sys.executable, "-c", _SINK, h1.ip], stdout=subprocess.PIPE, text=True)
    port = int(sink.stdout.readline())
    out = h0.run([sys.executable, "-c", _SOURCE, h1.ip, str(port), str(nbytes)], timeout=60).stdout
    sink.wait(timeout=30)
    got, secs = out.split()
    return int(got), float(secs)


def test_hosts_have_own_addresses_and_exchange_data() -> None:
    with VirtualNetwork(3, prefix="cdltest") as net:
        ips = [h.ip for h in net.hosts]
        assert len(set(ips)) == 3
        assert all(ip.startswith(net.subnet.rsplit(".", 1)[0]) for ip in ips)
        got, _ = _send(net, 1 << 20)
        assert got == 1 << 20
        # The host's interface carries its address: gloo needs GLOO_SOCKET_IFNAME to name it.
        addr = net.hosts[2].run(["ip", "-br", "addr", "show", "dev", net.hosts[2].ifname]).stdout
        assert ips[2] in addr
        env = net.dist_env(2, master_port=1234)
        assert env["MASTER_ADDR"] == ips[0] and env["GLOO_SOCKET_IFNAME"] == net.hosts[2].ifname
        # Two ranks per host: rank 5 is the second rank on host 2.
        env = net.dist_env(5, master_port=1234, ranks_per_host=2)
        assert env["WORLD_SIZE"] == "6" and env["GLOO_SOCKET_IFNAME"] == net.hosts[2].ifname
        assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"]) == ("1", "2", "2")


def test_rate_limit_limits_throughput() -> None:
    rate_mbit = 40
    nbytes = 3 * rate_mbit * 1_000_000 // 8 // 2  # ~1.5 s at the limit
    with VirtualNetwork(2, rate_mbit=rate_mbit, prefix="cdltest") as net:
        got, secs = _send(net, nbytes)
    assert got == nbytes
    measured_mbit = got * 8 / secs / 1e6
    # Loose band: the limit must bite (an unlimited veth moves gigabits) but still let traffic through.
    # Measured (16 runs, 8 of them beside two CPU burners, 2-core host): 0.950-0.967 x the rate; the
    # band leaves a margin of 3x below and 1.6x above.
    assert 0.3 * rate_mbit < measured_mbit < 1.6 * rate_mbit, measured_mbit


def test_teardown_removes_namespaces_even_after_error() -> None:
    names: list[str] = []
    with pytest.raises(ZeroDivisionError), VirtualNetwork(2, prefix="cdltest") as net:
        names = [net.switch] + [h.netns for h in net.hosts]
        net.hosts[0].popen(["sleep", "60"])  # a process left running must not keep anything alive
        1 / 0  # noqa: B018
    left = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
    assert not left & set(names)


def test_cleanup_stale_removes_dead_owners_only() -> None:
    # A child builds a network and dies by SIGKILL without tearing down.
    code = (
        "import os, signal; from tests.support.netns import VirtualNetwork\n"
        "n = VirtualNetwork(1, prefix='cdlstale').start(); print(n.switch, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    switch = res.stdout.strip()
    assert switch and switch in os.listdir("/run/netns")
    with VirtualNetwork(1, prefix="cdlstale") as live:
        removed = cleanup_stale("cdlstale")
        assert switch in removed
        assert live.switch in os.listdir("/run/netns")
    assert switch not in os.listdir("/run/netns")


_ALLREDUCE = """
import datetime, torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
t = torch.ones(4) * (dist.get_rank() + 1); dist.all_reduce(t)
print(t.tolist()); dist.destroy_process_group()
"""


@pytest.mark.slow
def test_gloo_allreduce_across_hosts() -> None:
    with VirtualNetwork(2, rate_mbit=100, prefix="cdltest") as net:
        port = net.hosts[0].free_port()
        procs = [
            h.popen(
                [sys.executable, "-c", _ALLREDUCE],
                env=net.dist_env(i, master_port=port),
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )  # fmt: skip
            for i, h in enumerate(net.hosts)
        ]
        outs = [p.communicate(timeout=90)[0].strip() for p in procs]
    assert outs == ["[3.0, 3.0, 3.0, 3.0]"] * 2


def test_set_rate_changes_and_removes_one_hosts_limit() -> None:
    nbytes = 2 * 1_000_000  # 0.8 s at 20 Mbit/s
    with VirtualNetwork(2, prefix="cdltest") as net:
        net.set_rate(1, 20)
        got, secs = _send(net, nbytes)
        limited = got * 8 / secs / 1e6
        net.set_rate(1, None)
        got, secs = _send(net, nbytes)
        free = got * 8 / secs / 1e6
    # Measured (16 runs, 8 beside two CPU burners): limited 19.66-20.04 Mbit/s, free 3400-30000 Mbit/s.
    assert 6 < limited < 32, limited
    assert free > 3 * limited, (free, limited)

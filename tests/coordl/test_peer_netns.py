"""Bad input against a node's peer server across real processes and network namespaces (issue 14).

Node 0 runs a :class:`coordl.partitioned.server.PeerServer` in its own process, bound to its address on
the emulated network; node 1 runs an attacker process that tries every kind of bad input, then a
legitimate client. The server must answer each with an error or a closed connection, keep serving,
and store nothing but the one legitimate PUT.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.netns import VirtualNetwork, skip_reason

pytestmark = pytest.mark.netns

SECRET = "netns-test-secret-0123456789abcdef"

SERVER = r"""
import json, os, sys
from coordl.partitioned.server import PeerServer

class Cache:
    num_items = 100
    def __init__(self):
        self.items = {i: bytes([i]) * 100 for i in range(0, 100, 2) if i < 10}
    def get(self, i):
        raw = self.items.get(i)
        return None if raw is None else memoryview(raw)
    def put(self, i, raw):
        self.items.setdefault(i, bytes(raw))
        return True

cache = Cache()
server = PeerServer(cache, secret=os.environ["PEER_SECRET"].encode(), owns=lambda i: i % 2 == 0,
                    host=sys.argv[1], item_size=lambda i: 100, max_connections=64, auth_timeout_s=1.0)
print(server.address[1], flush=True)
sys.stdin.readline()
print(json.dumps({"stats": server.stats(), "stored": sorted(cache.items)}), flush=True)
server.stop()
"""

ATTACKER = r"""
import json, os, socket, sys, time
import numpy as np
from coordl.partitioned import protocol as P
from coordl.partitioned.auth import HELLO, NONCE_BYTES, AuthError, client_handshake, client_mac
from coordl.partitioned.peer import PeerClient
from shmem import codec

ip, port = sys.argv[1], int(sys.argv[2])
secret = os.environ["PEER_SECRET"].encode()
addr = (ip, port)
res = {}

def closed(s, timeout=5.0):
    s.settimeout(timeout)
    try:
        while True:
            if s.recv(65536) == b"":
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False

def fresh():
    s = socket.create_connection(addr, timeout=5)
    assert s.recv(len(HELLO) + NONCE_BYTES, socket.MSG_WAITALL)[:4] == HELLO
    return s

def authed():
    s = socket.create_connection(addr, timeout=5)
    client_handshake(s, secret)
    return s

def reply(s):
    prefix = s.recv(codec.PREFIX_BYTES, socket.MSG_WAITALL)
    rest = s.recv(codec.frame_size(prefix) - len(prefix), socket.MSG_WAITALL)
    return codec.read_prefix(prefix).kind, codec.decode(prefix + rest, P.FRAME_KEY)

def send_and_closed(s, data):
    try:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    return closed(s)

with fresh() as s:
    res["garbage_before_auth_closed"] = send_and_closed(s, os.urandom(64))
with socket.create_connection(addr, timeout=5) as s:
    try:
        client_handshake(s, b"x" * 32)
        res["wrong_secret_refused"] = False
    except AuthError:
        res["wrong_secret_refused"] = True
with fresh() as s:
    nonce = os.urandom(NONCE_BYTES)  # a MAC made for another server nonce (replay: see test_peer.py)
    res["stale_mac_closed"] = send_and_closed(s, nonce + client_mac(secret, b"\0" * NONCE_BYTES, nonce))
with fresh() as s:
    t0 = time.monotonic()
    res["silent_client_closed"] = closed(s, timeout=10)  # auth_timeout_s=1 plus one loop sweep
    res["silent_client_closed_after_s"] = round(time.monotonic() - t0, 1)
good = codec.encode({"i": np.array([0])}, P.FRAME_KEY, kind=P.OP_GET)
for name, data in {
    "wrong_magic": b"XXXX" + good[4:],
    "truncated": good[:-5],
    "oversized_length": good[:16] + (1 << 40).to_bytes(8, "little") + good[24:],  # announces 1 TiB
    "garbage_after_auth": os.urandom(300),
}.items():
    with authed() as s:
        res[name + "_closed"] = send_and_closed(s, data)
with authed() as s:
    s.sendall(codec.encode({"i": 3, "data": b"p" * 100}, P.FRAME_KEY, kind=P.OP_PUT))
    st, tree = reply(s)
    res["put_not_owned_refused"] = st == P.ST_ERR and "not this node" in tree["error"]
    bad = bytearray(codec.encode({"i": 4, "data": b"p" * 100}, P.FRAME_KEY, kind=P.OP_PUT))
    bad[-7] ^= 1
    s.sendall(bad)
    st, tree = reply(s)
    res["put_bad_checksum_refused"] = st == P.ST_ERR and "crc" in tree["error"]
    s.sendall(codec.encode({"i": 6, "data": b"p" * 99}, P.FRAME_KEY, kind=P.OP_PUT))
    st, tree = reply(s)
    res["put_wrong_length_refused"] = st == P.ST_ERR and "bytes" in tree["error"]
flood = []
for _ in range(1000):
    try:
        flood.append(socket.create_connection(addr, timeout=5))
    except OSError:
        break
res["flood_connected"] = len(flood)
time.sleep(0.5)
for s in flood:
    s.close()
time.sleep(1.0)
client = PeerClient([addr], secret=secret, timeout_s=5)
got = client.fetch({0: [0, 2, 4, 5]})
res["legit_get_after_attacks"] = sorted(got) == [0, 2, 4] and bytes(got[2]) == bytes([2]) * 100
res["legit_put_stored"] = client.put(0, 50, bytes([50]) * 100)
print(json.dumps(res), flush=True)
"""


@pytest.fixture(autouse=True)
def _needs_netns() -> None:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)


def test_bad_input_from_another_node_is_refused_and_nothing_wrong_is_stored(tmp_path: Path) -> None:
    (tmp_path / "server.py").write_text(SERVER)
    (tmp_path / "attacker.py").write_text(ATTACKER)
    env = {"PEER_SECRET": SECRET}
    with VirtualNetwork(2, prefix="cdlpeer") as net:
        srv_host, att_host = net.hosts
        server = srv_host.popen(
            [sys.executable, str(tmp_path / "server.py"), srv_host.ip],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        port = int(server.stdout.readline())
        # Bound to the node's address, not to every interface: its loopback does not reach it.
        probe = "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=2)"
        assert srv_host.run([sys.executable, "-c", probe, str(port)], check=False).returncode != 0
        attack = att_host.run(
            [sys.executable, str(tmp_path / "attacker.py"), srv_host.ip, str(port)],
            env=env,
            timeout=120,
            check=False,
        )
        out, err = server.communicate("done\n", timeout=30)
    assert attack.returncode == 0, attack.stderr[-3000:]
    res = json.loads(attack.stdout.strip().splitlines()[-1])
    failed = {k: v for k, v in res.items() if v is False}
    assert not failed, res
    assert res["flood_connected"] == 1000
    assert server.returncode == 0, err[-2000:]
    final = json.loads(out.strip().splitlines()[-1])
    stats = final["stats"]
    assert final["stored"] == [0, 2, 4, 6, 8, 50]  # the seeded items and the one legitimate PUT
    assert stats["auth_failures"] >= 3 and stats["conns_refused_full"] > 0
    assert stats["puts_refused_not_owner"] == 1 and stats["puts_refused_checksum"] == 1
    assert stats["puts_refused_length"] == 1 and stats["bad_frames"] >= 3

"""What the nodes of a partitioned job agree on at start-up: the secret, each node's Redis address and budget.

Node leaders send one fixed-size plain-text record each through an ``all_gather`` of the default process
group (a byte tensor, never pickle); every rank checks the same records, so a mismatch (dataset, seed,
secret, a Redis that refused its password) fails on every rank at once with an error naming the nodes.

The secret: ``COORDL_PEER_SECRET`` (or ``secret=``), the same on every rank; else rank 0 makes one and
sends it in its record (not with TLS of the job's own CA across nodes: that job is refused, as the CA
would follow from a secret sent in clear text). It becomes the ``requirepass`` of the Redis servers the
job starts itself. Nodes compare a fingerprint (a keyed hash, not the secret) so that another secret is
caught at start-up.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import os
import secrets
import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from coordl.partitioned.ownership import NodeTopology

__all__ = [
    "SECRET_ENV",
    "new_secret",
    "check_secret",
    "secret_from_env",
    "fingerprint",
    "advertise_address",
    "Agreement",
    "exchange",
]

SECRET_ENV = "COORDL_PEER_SECRET"
MIN_SECRET_BYTES = 16
_RECORD_BYTES = 320  # one node leader's record in the exchange: fixed size, plain text
_STATUS = {  # why a node's own Redis (COORDL_PEER_REDIS) cannot be used, as its record says it
    "wrongpass": "refused the password in MEMCACHE_PASSWORD (set the one its 'memcache serve' was given)",
    "unreachable": "cannot be reached (is its 'memcache serve' running at COORDL_PEER_REDIS?)",
}


def new_secret() -> bytes:
    """A fresh 32-byte secret (rank 0 makes one per job when the user gives none)."""
    return secrets.token_bytes(32)


def check_secret(secret: bytes | str, origin: str) -> bytes:
    """``secret`` as bytes, refused when shorter than 16 bytes (``origin`` names where it came from)."""
    raw = secret.encode() if isinstance(secret, str) else bytes(secret)
    if len(raw) < MIN_SECRET_BYTES:
        raise ValueError(
            f"{origin}: the peer secret must be at least {MIN_SECRET_BYTES} bytes, got {len(raw)}"
        )
    return raw


def secret_from_env(env: Mapping[str, str] | None = None) -> bytes | None:
    """``COORDL_PEER_SECRET`` as bytes (its UTF-8 text), or None when unset."""
    env = os.environ if env is None else env
    value = env.get(SECRET_ENV)
    return None if not value else check_secret(value, SECRET_ENV)


def fingerprint(secret: bytes) -> str:
    """16 hex digits that let the nodes see at start-up that they hold the same secret.

    A keyed hash, not the secret; but whoever reads the rendezvous could test guesses of a weak
    (password-like) secret against it, so a user-given secret should be random (``openssl rand -hex 32``).
    """
    return hmac.new(secret, b"coordl-peer fingerprint", hashlib.sha256).hexdigest()[:16]


def advertise_address(env: Mapping[str, str] | None = None) -> str:
    """The address peers should use to reach this node's Redis.

    ``COORDL_PEER_ADDR`` when set; else the address of the interface gloo was told to use
    (``GLOO_SOCKET_IFNAME``); else the source address the routing table picks towards ``MASTER_ADDR``
    (a UDP socket's ``connect`` sends nothing); else 127.0.0.1.
    """
    env = os.environ if env is None else env
    if env.get("COORDL_PEER_ADDR"):
        return env["COORDL_PEER_ADDR"]
    ifname = (env.get("GLOO_SOCKET_IFNAME") or "").split(",")[0].strip()
    if ifname:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                req = struct.pack("256s", ifname.encode()[:15])
                return socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])  # SIOCGIFADDR
            except OSError as exc:
                raise OSError(f"GLOO_SOCKET_IFNAME={ifname!r} has no IPv4 address here: {exc}") from exc
    master = env.get("MASTER_ADDR")
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((master, 9))
                return s.getsockname()[0]
        except OSError:
            pass
    return "127.0.0.1"


def _all_gather_text(world_size: int, record: str) -> list[str]:
    """All ranks' records (node leaders send theirs, others ""), via a tensor all_gather: no pickle."""
    import torch
    import torch.distributed as dist

    from coordl.errors import CoordlError

    if not (dist.is_available() and dist.is_initialized()):
        raise CoordlError(
            f"partitioned=True with WORLD_SIZE={world_size} needs torch.distributed.init_process_group() "
            "to be called before the DataLoader is built (the nodes exchange cache addresses through it)"
        )
    raw = record.encode()
    if len(raw) > _RECORD_BYTES:
        raise CoordlError(f"peer record too long ({len(raw)} bytes): {record!r}")
    mine = torch.zeros(_RECORD_BYTES, dtype=torch.uint8)
    if raw:  # frombuffer refuses an empty buffer (ranks other than a node leader send "")
        mine[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    out = [torch.zeros_like(mine) for _ in range(world_size)]
    dist.all_gather(out, mine)
    return [bytes(t.numpy()).rstrip(b"\0").decode() for t in out]


@dataclass(frozen=True)
class Agreement:
    """The outcome of the exchange, the same on every rank."""

    addresses: list[tuple[str, int]]  # each node's Redis
    weights: list[int]  # each node's cache budget
    secret: bytes  # the job's secret
    shared: bool  # the nodes' Redis are the users' own (``memcache serve``), not started by the job
    tls: bool = False  # the nodes' Redis speak TLS only


def exchange(
    topo: NodeTopology,
    redis: tuple[str, int, bool, str] | None,
    user_secret: bytes | None,
    num_items: int,
    cache_bytes: int,
    seed: int,
    tls: bool = False,
    secret_ca: bool = False,
) -> Agreement:
    """Every node's Redis address and budget, and the job's secret, through one all_gather.

    ``redis`` is this node leader's ``(host, port, shared, status)`` (None on other ranks), ``status``
    ``ok`` or why its Redis cannot be used (a key of :data:`_STATUS`). A record: ``node host port cache_bytes num_items
    seed fingerprint secret shared status tls``, where ``secret`` is the hex secret rank 0 made when the user
    gave none ("-" otherwise, or from other ranks) and ``tls`` 1 when its Redis speaks TLS only.
    ``secret_ca``: the TLS CA is derived from the secret; across nodes rank 0 then sends none
    (:func:`_refuse_sent_secret`).
    """
    from coordl.errors import CoordlError

    rank, world, num_nodes = topo.rank, topo.world_size, topo.num_nodes
    no_sending = secret_ca and num_nodes > 1
    made = new_secret() if rank == 0 and user_secret is None and not no_sending else None
    record = ""
    if redis is not None:
        host, port, shared, status = redis
        key = user_secret or made
        fp = fingerprint(key) if key else "-"
        record = (
            f"{topo.node} {host} {port} {int(cache_bytes)} {num_items} {seed} {fp} "
            f"{made.hex() if made else '-'} {int(shared)} {status} {int(tls)}"
        )
    records = [r.split() for r in _all_gather_text(world, record) if r]
    nodes: dict[int, list[str]] = {int(r[0]): r for r in records}
    for r in records:
        if (int(r[4]), int(r[5])) != (num_items, seed):
            raise CoordlError(
                f"node {r[0]} built its partitioned cache for {r[4]} items with seed {r[5]}, this node for "
                f"{num_items} items with seed {seed}: every rank must use the same dataset and seed"
            )
    if sorted(nodes) != list(range(num_nodes)):
        raise CoordlError(f"expected one Redis per node 0..{num_nodes - 1}, got nodes {sorted(nodes)}")
    bad = [f"node {r[0]} ({r[1]}:{r[2]}) {_STATUS.get(r[9], r[9])}" for r in records if r[9] != "ok"]
    if bad:
        raise CoordlError("the partitioned cache's Redis cannot be used on " + "; ".join(bad))
    if len({r[8] for r in records}) != 1:
        raise CoordlError(
            "some nodes use their own 'memcache serve' Redis (COORDL_PEER_REDIS) and others not: "
            "set it on every node or on none"
        )
    if {r[10] for r in records} != {str(int(tls))}:
        plain = [r[0] for r in records if r[10] == "0"]
        raise CoordlError(
            f"node(s) {', '.join(plain) or 'none'} run their Redis in plain text and others with TLS "
            "(COORDL_PEER_TLS, or a rediss:// COORDL_PEER_REDIS): set the same on every rank"
        )
    if no_sending:
        _refuse_sent_secret(records)
    # Rank 0 (always a node leader, so records[0]) either sends the secret it made or holds the user's:
    # its fingerprint is the job's. Every leader checks the same records, so all fail together.
    sent = [bytes.fromhex(r[7]) for r in records if r[7] != "-"]
    ref = records[0][6]
    allowed = {ref, "-"} if sent else {ref}
    odd = [r[0] for r in records if r[6] not in allowed]
    if odd:
        raise CoordlError(
            f"node(s) {', '.join(odd)} hold another peer secret than rank 0 ({SECRET_ENV} or secret=): "
            "set the same secret on every rank, or none (rank 0 then makes one)"
        )
    if user_secret is None and not sent:
        raise CoordlError(
            f"rank 0 holds a peer secret ({SECRET_ENV} or secret=) and this rank none: set it on every rank"
        )
    job_secret = user_secret if user_secret is not None else sent[0]
    if fingerprint(job_secret) != ref:
        raise CoordlError(f"this rank's peer secret ({SECRET_ENV} or secret=) differs from rank 0's")
    addresses = [(nodes[k][1], int(nodes[k][2])) for k in range(num_nodes)]
    weights = [int(nodes[k][3]) for k in range(num_nodes)]
    return Agreement(addresses, weights, job_secret, records[0][8] == "1", tls)


def _refuse_sent_secret(records: list[list[str]]) -> None:
    """TLS with the job's own CA across nodes: every node leader must hold the user's secret.

    The rendezvous (gloo's links, the ``MASTER_ADDR`` store) is clear text and unauthenticated: a
    secret sent through it is known to whoever reads it, and so is the CA derived from it, which would
    let them present a certificate every node's Redis accepts, read and alter items on the path, and
    pass for a node's Redis. No exchange over that channel can fix it without something shared
    beforehand, so the job is refused rather than run with TLS that protects nothing.
    """
    from coordl.errors import CoordlError

    without = [r[0] for r in records if r[6] == "-" or r[7] != "-"]
    if without:
        raise CoordlError(
            f"TLS with the job's own certificates across nodes needs {SECRET_ENV}, the same on every rank: "
            f"node(s) {', '.join(without)} have none, and a secret rank 0 made would cross the network in "
            "clear text with the start-up exchange (whoever read it could make certificates the nodes' "
            f"Redis accept). Set {SECRET_ENV} to the same random value on every rank (e.g. from your "
            "secret store, or `openssl rand -hex 32`), or give every node your own certificate files "
            "(MEMCACHE_TLS_CA, MEMCACHE_TLS_CERT, MEMCACHE_TLS_KEY, or tls=memcache.TLS(...))"
        )

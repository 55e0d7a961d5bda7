"""The peer transport's messages: :mod:`shmem.codec` frames whose ``kind`` is the op or the status.

After the handshake (:mod:`coordl.partitioned.auth`) a connection carries any number of request /
response pairs, one at a time:

    GET   {"i": int64 array}                   -> OK {"hit": int64 array, "items": [bytes, ...], "more": int64 array}
    PUT   {"i": int, "data": bytes}            -> OK {"stored": bool}   or ERR {"error": str} (refused)
    PING  None                                 -> OK None

A GET asks for all of a batch's items owned by one node in one round trip. ``hit`` lists the items
sent (in ``items``), ``more`` those the server had but left out to keep the reply under its size
budget (the client asks again for them); the rest are misses. The codec's payload CRC is the PUT's
checksum: a PUT whose bytes were damaged fails to decode and is refused, never stored.
"""

from __future__ import annotations

import socket
from typing import Any

from shmem import codec

__all__ = [
    "recv_exact",
    "recv_frame",
    "send_parts",
    "OP_GET",
    "OP_PUT",
    "OP_PING",
    "ST_OK",
    "ST_ERR",
    "FRAME_KEY",
    "MAX_GET_ITEMS",
    "DEFAULT_REPLY_BUDGET",
    "FRAME_OVERHEAD",
    "PEER_COUNTERS",
    "SERVER_COUNTERS",
]

OP_GET, OP_PUT, OP_PING = 1, 2, 3
ST_OK, ST_ERR = 0, 3
FRAME_KEY = b"coordl-peer-v2"  # codec key tag: frames of another protocol or version are refused
MAX_GET_ITEMS = 4096  # indices in one GET (a batch's remote items from one owner)
DEFAULT_REPLY_BUDGET = 64 << 20  # bytes of items in one GET reply; the remainder is listed in "more"
FRAME_OVERHEAD = 64 << 10  # prefix, header and alignment on top of a frame's item bytes

PEER_COUNTERS = (
    "remote_hits",
    "remote_misses",
    "remote_bytes",
    "remote_errors",
    "remote_pushes",
    "remote_skipped_down",
    "remote_requests",
)

# Counted by a node's server (one SharedCounters-like dict per server, see PeerServer.stats()).
SERVER_COUNTERS = (
    "conns_accepted",
    "conns_refused_full",
    "auth_failures",
    "bad_frames",
    "timeouts",
    "get_requests",
    "items_served",
    "puts_stored",
    "puts_refused_not_owner",
    "puts_refused_length",
    "puts_refused_checksum",
)


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    """Exactly ``n`` bytes (the socket's timeout bounds each wait); ConnectionResetError on EOF."""
    buf = bytearray(n)
    _recv_into(sock, memoryview(buf))
    return buf


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    got, n = 0, view.nbytes
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionResetError(f"peer closed the connection after {got} of {n} bytes")
        got += k


def recv_frame(sock: socket.socket, max_payload: int) -> bytearray:
    """One codec frame: its prefix, checked against ``max_payload`` before the rest is read into place."""
    prefix = recv_exact(sock, codec.PREFIX_BYTES)
    total = codec.frame_size(prefix, max_payload=max_payload)
    frame = bytearray(total)
    frame[: codec.PREFIX_BYTES] = prefix
    _recv_into(sock, memoryview(frame)[codec.PREFIX_BYTES :])
    return frame


_IOV_MAX = 1024


def send_parts(sock: socket.socket, parts: list[Any]) -> None:
    """Send buffers back to back with ``sendmsg`` (no join: the cache's item views go out as they are)."""
    views = [memoryview(p).cast("B") for p in parts]
    i = 0
    while i < len(views):
        sent = sock.sendmsg(views[i : i + _IOV_MAX])
        while sent and i < len(views):
            if sent >= views[i].nbytes:
                sent -= views[i].nbytes
                i += 1
            else:
                views[i] = views[i][sent:]
                sent = 0

"""The peer transport's shared secret and its challenge-response handshake (HMAC-SHA256, fresh nonces).

Every connection to a node's :class:`coordl.partitioned.server.PeerServer` starts with a mutual
challenge-response before any request is read::

    server -> client   HELLO (4 bytes) | server nonce (32)
    client -> server   client nonce (32) | HMAC(secret, "coordl-peer client" | server nonce | client nonce)
    server -> client   HMAC(secret, "coordl-peer server" | client nonce | server nonce)

The server's nonce is fresh for every connection, so a recorded client answer is useless on another
connection (no replay); the client checks the server's answer, so a process that merely listens on a
peer's address cannot feed a worker items. The secret never crosses the wire. What this does not give
(integrity of the stream after the handshake against an attacker who can rewrite TCP segments in flight)
is stated in ``docs/distributed.md``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket

from coordl.partitioned.protocol import recv_exact

__all__ = [
    "SECRET_ENV",
    "HELLO",
    "NONCE_BYTES",
    "MAC_BYTES",
    "AuthError",
    "new_secret",
    "check_secret",
    "secret_from_env",
    "fingerprint",
    "client_mac",
    "server_mac",
    "client_handshake",
]

SECRET_ENV = "COORDL_PEER_SECRET"
HELLO = b"CDH1"
NONCE_BYTES = 32
MAC_BYTES = 32
MIN_SECRET_BYTES = 16


class AuthError(ConnectionError):
    """A handshake failed: wrong secret, a replayed or malformed answer, or not our protocol."""


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


def secret_from_env(env: dict[str, str] | None = None) -> bytes | None:
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


def client_mac(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(secret, b"coordl-peer client" + server_nonce + client_nonce, hashlib.sha256).digest()


def server_mac(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(secret, b"coordl-peer server" + client_nonce + server_nonce, hashlib.sha256).digest()


def client_handshake(sock: socket.socket, secret: bytes) -> None:
    """Run the client side on a fresh connection; raises :class:`AuthError` when the server fails it."""
    hello = recv_exact(sock, len(HELLO) + NONCE_BYTES)
    if hello[: len(HELLO)] != HELLO:
        raise AuthError(f"not a coordl peer server (greeting {bytes(hello[:4])!r})")
    server_nonce = bytes(hello[len(HELLO) :])
    client_nonce = secrets.token_bytes(NONCE_BYTES)
    sock.sendall(client_nonce + client_mac(secret, server_nonce, client_nonce))
    try:
        answer = recv_exact(sock, MAC_BYTES)
    except ConnectionResetError:
        raise AuthError("the server closed the connection: it refused our secret") from None
    if not hmac.compare_digest(bytes(answer), server_mac(secret, server_nonce, client_nonce)):
        raise AuthError("the server failed authentication (it does not hold this job's secret)")

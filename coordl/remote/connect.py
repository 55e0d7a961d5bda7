"""What the user passes as ``remote_prep=``: the Ray cluster's address, how many remote CPUs, its token.

:class:`RemotePrep` is plain settings until a loader attaches to it; then it connects this process to
the cluster as a Ray driver (``ray.init(address=...)``), once per process. A cluster that cannot be
reached fails at once with one :class:`RemotePrepError` naming the address: a TCP connect to the
address is tried first (a few seconds), since Ray itself retries an unreachable address for minutes.

Authentication is Ray's own: a cluster started with ``RAY_AUTH_MODE=token`` (Ray >= 2.52) refuses a
driver without its token. ``token=`` hands it to Ray the way Ray reads it (the ``RAY_AUTH_MODE`` and
``RAY_AUTH_TOKEN`` environment variables of this process, set before Ray connects); without it Ray
looks where it always does (those variables, ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``).
"""

from __future__ import annotations

import os
import socket
from typing import Any

__all__ = ["RemotePrep", "RemotePrepError", "split_address"]

# Read modes: where a remote actor gets an item's raw bytes (see RemotePrep).
READ_MODES = ("auto", "remote", "ship")


class RemotePrepError(ConnectionError):
    """The Ray cluster of ``remote_prep=`` could not be reached or used (the message names its address)."""


class RemotePrep:
    """Prep on the CPUs of a Ray cluster, in addition to the loader's local workers.

    Args:
        address: the cluster's GCS address, ``"host:port"`` as ``ray start --head --port`` printed it
            (``"ray://host:10001"`` for Ray Client, which needs ``ray[client]``), or ``"auto"`` for the
            cluster this machine is a node of.
        cpus: remote actors to start, one CPU each (default: every CPU the cluster offers when the
            loader connects). The trainer's node should join the cluster with ``--num-cpus 0`` so that
            no actor lands next to the trainer.
        read: where an actor gets an item's raw bytes. ``"remote"``: it reads the dataset itself (the
            same paths or URLs must work on its node: NFS, a bucket); ``"ship"``: the trainer reads
            them (through its MinIO cache) and sends them with the batch; ``"auto"`` (default): each
            actor reads the first item of the first batch once and compares it with the trainer's
            read of it, then reads for itself if they match, else is sent the bytes.
        token: the cluster's Ray authentication token (see the module docstring); None: Ray's own
            lookup.
        resources: extra Ray resources each actor needs, e.g. ``{"prep": 1}`` for nodes started with
            ``--resources '{"prep": 4}'``: keeps actors on the nodes meant for prep.
        depth: batches queued per actor, so that it never waits for the round trip (default 2).
        start_timeout: seconds to wait for the actors to start at the first epoch; an actor not up by
            then is given up with a warning.
    """

    def __init__(
        self,
        address: str,
        *,
        cpus: int | None = None,
        read: str = "auto",
        token: str | None = None,
        resources: dict[str, float] | None = None,
        depth: int = 2,
        start_timeout: float = 120.0,
    ) -> None:
        if not isinstance(address, str) or not address:
            raise ValueError(f"RemotePrep: address must be 'host:port' or 'ray://host:port', got {address!r}")
        if address != "auto":
            split_address(address)  # a malformed address is refused here, not at the first epoch
        if cpus is not None and (not isinstance(cpus, int) or isinstance(cpus, bool) or cpus < 1):
            raise ValueError(f"RemotePrep: cpus must be an int >= 1 or None, got {cpus!r}")
        if read not in READ_MODES:
            raise ValueError(f"RemotePrep: read must be one of {READ_MODES}, got {read!r}")
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
            raise ValueError(f"RemotePrep: depth must be an int >= 1, got {depth!r}")
        if token is not None and (not isinstance(token, str) or not token):
            raise ValueError("RemotePrep: token must be a non-empty string or None")
        self.address = address
        self.cpus = cpus
        self.read = read
        self.token = token
        self.resources = dict(resources or {})
        self.depth = depth
        self.start_timeout = float(start_timeout)

    def __repr__(self) -> str:
        return f"coordl.RemotePrep({self.address!r}, cpus={self.cpus}, read={self.read!r})"

    def connect(self) -> Any:
        """This process as a driver of the cluster (once per process); returns the ``ray`` module."""
        try:
            import ray
        except ImportError as error:
            raise ImportError(
                "remote_prep needs Ray on the trainer and on every prep node: pip install 'coordl[ray]'"
            ) from error
        global _connected
        if ray.is_initialized():
            # this process already is a driver: of this cluster (another loader's connect), or the user's
            # own ray.init (trusted); Ray allows one cluster per process
            if _connected is not None and _connected != self.address and self.address != "auto":
                raise RemotePrepError(
                    f"remote_prep: this process is already connected to the Ray cluster at {_connected}, "
                    f"not {self.address} (Ray allows one cluster per process)"
                )
            return ray
        if self.address != "auto":
            _probe(self.address)
        if self.token is not None:
            os.environ["RAY_AUTH_MODE"] = "token"
            os.environ["RAY_AUTH_TOKEN"] = self.token
            _refresh_ray_config()
        host = self.address.rsplit(":", 1)[0]
        # a cluster on this machine's loopback: the driver joins it as 127.0.0.1 too (Ray would otherwise
        # advertise the machine's first interface address and have the nodes call back through it)
        local = {"_node_ip_address": host} if host.startswith("127.") or host == "localhost" else {}
        try:
            ray.init(address=self.address, log_to_driver=False, logging_level="WARNING", **local)
        except Exception as error:
            raise RemotePrepError(
                f"remote_prep: could not connect to the Ray cluster at {self.address}: {error} "
                "(a cluster started with RAY_AUTH_MODE=token needs its token: RemotePrep(token=...) or "
                "RAY_AUTH_TOKEN)"
            ) from error
        _connected = self.address
        return ray


# The address this process connected to through RemotePrep (None: not connected by coordl).
_connected: str | None = None


def split_address(address: str) -> tuple[str, int]:
    """``(host, port)`` of ``"host:port"`` or ``"ray://host:port"``; a clear ValueError otherwise."""
    rest = address[len("ray://") :] if address.startswith("ray://") else address
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"RemotePrep: address must be 'host:port' or 'ray://host:port', got {address!r}")
    return host.strip("[]"), int(port)


def _probe(address: str, timeout: float = 5.0) -> None:
    """Fail fast, naming ``address``, when nothing accepts a TCP connection there."""
    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as error:
        raise RemotePrepError(
            f"remote_prep: cannot reach the Ray cluster at {address} ({error}); start it with "
            f"`ray start --head --port {port}` on {host}, or check the address (docs/remote_prep.md)"
        ) from error


def _refresh_ray_config() -> None:
    """Make an already-imported Ray see the authentication variables just set (Ray does the same
    when ``ray start`` turns token authentication on); older Rays without it read them at connect."""
    try:
        from ray._raylet import Config  # type: ignore[attr-defined]  # a native module: no annotations
    except ImportError:
        return
    Config.initialize("")

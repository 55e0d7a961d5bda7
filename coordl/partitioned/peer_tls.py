"""TLS for the partitioned cache's Redis: which certificates, and the per-job CA made from the job's secret.

Asked for with ``coordl.DataLoader(partitioned=coordl.PartitionedOptions(tls=True))`` (or
``build_partitioned_tier(..., tls=True)``), with ``COORDL_PEER_TLS=1`` as the default when the
keyword leaves it None, or a ``rediss://`` address in ``COORDL_PEER_REDIS``. Three sources of
certificates:

- **the job's own** (nothing to provide but the secret): every rank derives the same CA from the job's
  secret (:func:`memcache.certs.ca_from_secret`); each node leader signs a certificate for the address
  it advertises and its Redis serves with it; each process signs a client certificate of its own.
  Nothing but the secret is shared, and whoever lacks it has no certificate a node's Redis accepts, nor
  can it pass for one: the clients check the CA and the address. On more than one node the secret must
  be the user's (``COORDL_PEER_SECRET`` on every rank): one rank 0 made would travel the clear-text
  rendezvous, and the job is refused (:func:`coordl.partitioned.rendezvous.exchange`).
- **your files** (``MEMCACHE_TLS_CA``/``_CERT``/``_KEY``, or ``tls=memcache.TLS(...)``): each node's
  certificate names that node's advertised address; its Redis and its clients use it.
- **a shared** ``memcache serve --tls`` **Redis** (``COORDL_PEER_REDIS=rediss://host:port``): your files,
  as for the sample cache.

The job's secret is known only after the start-up exchange (rank 0 may make it), so a self-started
Redis first serves TLS with a throw-away CA (nobody else trusts it: plain text is never on), then takes
the job's certificates and password in one ``CONFIG SET`` (:func:`switch_server`).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

from memcache import certs
from memcache.server import client_for
from memcache.tls import TLS, resolve
from shmem.segment import owner_alive, owner_tag

__all__ = ["TLS_ENV", "wanted", "boot_tls", "switch_server", "client_tls", "external_tls"]

TLS_ENV = "COORDL_PEER_TLS"
_DIR_PREFIX = "coordl-tls-"  # coordl-tls-<pid>-<start>-<random>: a killed owner's is reclaimed
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


def wanted(tls: TLS | bool | None, env: Mapping[str, str] | None = None) -> TLS | bool:
    """What a self-started Redis should serve: False (plain text), True (the job's own certificates) or
    your files (``tls`` itself, or ``MEMCACHE_TLS_*`` when TLS is asked for and they are set)."""
    env = os.environ if env is None else env
    if tls is not None and not isinstance(tls, (bool, TLS)):
        raise TypeError(f"tls= must be True, False, None or a memcache.TLS, got {type(tls).__name__}")
    if tls is None:
        value = env.get(TLS_ENV, "").strip().lower()
        if value not in _TRUE | _FALSE:
            raise ValueError(f"{TLS_ENV}={env[TLS_ENV]!r}: use 1 (TLS) or 0 (plain text)")
        tls = value in _TRUE
    if tls is True:
        return TLS.from_env(env) or True
    return tls


def external_tls(tls: TLS | bool | None, url_says: bool | None) -> TLS | None:
    """The client files for a shared Redis (``COORDL_PEER_REDIS``); errors name the variables."""
    asked = wanted(tls)
    return resolve(
        asked if isinstance(asked, TLS) else (True if asked else None), url_says, "COORDL_PEER_REDIS"
    )


def _private_tempdir() -> str:
    """A 0700 temporary directory named for this process; first, remove those of processes that are gone.

    A process killed with SIGKILL never ran its clean-up: its directory (a client key of its job's CA)
    stays until the next job on this machine starts (the owner's start time in the name tells a reused
    pid apart, as for shared-memory segments).
    """
    base = tempfile.gettempdir()
    try:
        names = os.listdir(base)
    except OSError:
        names = []
    for name in names:
        parts = name[len(_DIR_PREFIX) :].split("-")
        if not name.startswith(_DIR_PREFIX) or len(parts) < 3 or not (parts[0] + parts[1]).isdigit():
            continue
        if not owner_alive(int(parts[0]), int(parts[1])):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{owner_tag()}-")


def boot_tls() -> tuple[TLS, str]:
    """Files of a throw-away CA the Redis starts with, and their directory (removed by :func:`switch_server`)."""
    directory = _private_tempdir()
    key, cert = certs.make_ca(directory, label="coordl boot CA")
    return certs.node_tls(key, cert, directory, "boot", ["127.0.0.1"]), directory


def switch_server(
    server: Any, secret: bytes, hosts: Iterable[str], password: str, boot_dir: str | None
) -> None:
    """Give a self-started Redis the job's password and, with ``boot_dir``, the job's certificates.

    One ``CONFIG SET`` over the start-up connection: later connections need both.
    """
    settings: list[str] = ["requirepass", password]
    job = None
    if boot_dir is not None:
        key, cert = certs.ca_from_secret(secret)
        job = certs.node_tls(key, cert, os.path.join(server.workdir, "tls"), "node", [*hosts, server.host])
        settings += ["tls-cert-file", job.cert, "tls-key-file", job.key, "tls-ca-cert-file", job.ca]
    client = client_for(server, socket_timeout=10)
    try:
        client.config_set(*settings)
    finally:
        client.close()
        if boot_dir is not None:
            shutil.rmtree(boot_dir, ignore_errors=True)
    server.password = password
    if job is not None:
        server.tls = job


def client_tls(secret: bytes) -> TLS:
    """This process's client certificate under the job's CA, in a private directory removed at exit."""
    directory = _private_tempdir()
    creator = os.getpid()

    def _remove() -> None:
        if os.getpid() == creator:  # a forked child that exits through atexit leaves its parent's files
            shutil.rmtree(directory, ignore_errors=True)

    atexit.register(_remove)
    key, cert = certs.ca_from_secret(secret)
    return certs.node_tls(key, cert, directory, "client")

"""TLS for the caches' Redis: the certificate files both ends use, and the settings they turn into.

Redis (6+, Debian's build included) speaks TLS itself; this module only says how to ask for it. One
:class:`TLS` holds three PEM files: the CA that signed every node's certificate (each end trusts only
it), this end's certificate and its private key. The same object configures a server
(:meth:`TLS.server_lines`: ``tls-port`` on, the plain-text ``port 0``, ``tls-auth-clients yes`` so a
client without a certificate of that CA is refused) and a client (:meth:`TLS.client_kwargs`: redis-py
verifies the server's certificate against the CA and, by default, that it names the address dialled).

Where the files come from: :mod:`memcache.certs` makes them (``memcache tls-init`` for your own CA,
or a per-job CA for the partitioned cache), or bring your own (any X.509 CA; certificates used by both
ends need the ``serverAuth`` and ``clientAuth`` key usages, or none).

The environment names them as it names the password (``MEMCACHE_PASSWORD``): ``MEMCACHE_TLS_CA``,
``MEMCACHE_TLS_CERT``, ``MEMCACHE_TLS_KEY`` (:meth:`TLS.from_env`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["TLS", "ENV_CA", "ENV_CERT", "ENV_KEY", "split_url", "resolve"]

ENV_CA = "MEMCACHE_TLS_CA"
ENV_CERT = "MEMCACHE_TLS_CERT"
ENV_KEY = "MEMCACHE_TLS_KEY"
_SCHEMES = {"redis": False, "rediss": True}


@dataclass(frozen=True)
class TLS:
    """The PEM files of one end of a mutually authenticated TLS link to Redis.

    Args:
        ca: the CA certificate(s) this end trusts: the server's must chain to it (client side), and so
            must every client's (server side).
        cert: this end's certificate (the server's, or the client's).
        key: its private key (keep it 0600).
        check_hostname: the client checks that the server's certificate names the host it dialled
            (an IP address SAN for an address). Turn off only for certificates made without the nodes'
            addresses; the CA check still applies.
    """

    ca: str
    cert: str
    key: str
    check_hostname: bool = True

    def __post_init__(self) -> None:
        for field in ("ca", "cert", "key"):
            path = os.fspath(getattr(self, field))
            if not os.path.isfile(path):
                raise FileNotFoundError(f"TLS {field} file {path!r} does not exist (or is not a file)")
            object.__setattr__(self, field, os.path.abspath(path))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TLS | None:
        """``MEMCACHE_TLS_CA``/``_CERT``/``_KEY`` as a :class:`TLS`; None when none is set.

        Raises:
            ValueError: some are set and not all (the message names the missing ones).
        """
        env = os.environ if env is None else env
        names = (ENV_CA, ENV_CERT, ENV_KEY)
        values = [env.get(n) or "" for n in names]
        if not any(values):
            return None
        missing = [n for n, v in zip(names, values, strict=True) if not v]
        if missing:
            raise ValueError(f"TLS needs {', '.join(names)} together; {', '.join(missing)} not set")
        return cls(ca=values[0], cert=values[1], key=values[2])

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``redis.Redis`` (and, without ``ssl``, of ``redis.connection.SSLConnection``)."""
        return {
            "ssl": True,
            "ssl_ca_certs": self.ca,
            "ssl_certfile": self.cert,
            "ssl_keyfile": self.key,
            "ssl_cert_reqs": "required",
            "ssl_check_hostname": self.check_hostname,
        }

    def connection_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``redis.connection.SSLConnection``."""
        kwargs = self.client_kwargs()
        del kwargs["ssl"]
        return kwargs

    def server_lines(self, port: int) -> list[str]:
        """redis.conf lines: TLS on ``port``, plain text off, client certificates of the CA required."""
        for path in (self.ca, self.cert, self.key):
            if any(c in path for c in '"\\\n\r'):
                raise ValueError(f"TLS file path {path!r} holds a quote, backslash or newline")
        return [
            "port 0",  # no plain-text listener at all
            f"tls-port {int(port)}",
            f'tls-cert-file "{self.cert}"',
            f'tls-key-file "{self.key}"',
            f'tls-ca-cert-file "{self.ca}"',
            "tls-auth-clients yes",
            'tls-protocols "TLSv1.2 TLSv1.3"',
        ]


def split_url(text: str) -> tuple[str, bool | None]:
    """``"rediss://host:port"`` -> ``("host:port", True)``; ``"redis://..."`` -> False; bare -> None."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        return text, None
    if scheme.lower() not in _SCHEMES:
        raise ValueError(f"{text!r}: the scheme must be redis:// or rediss:// (TLS), not {scheme}://")
    return rest.rstrip("/"), _SCHEMES[scheme.lower()]


def resolve(tls: TLS | bool | None, url_says: bool | None = None, where: str = "tls=") -> TLS | None:
    """The :class:`TLS` a client should use.

    ``tls`` is a :class:`TLS`, True (files from ``MEMCACHE_TLS_*``, required), False (plain text) or
    None (``MEMCACHE_TLS_*`` when set, else plain text). ``url_says`` is what a ``rediss://`` (True) or
    ``redis://`` (False) address asked for; a contradiction is an error naming ``where``.
    """
    if url_says is not None and tls is not None and bool(tls) != url_says:
        raise ValueError(f"{where}: a {'rediss' if url_says else 'redis'}:// address with tls={tls!r}")
    if isinstance(tls, TLS):
        return tls
    if tls is False or url_says is False:
        return None
    found = TLS.from_env()
    if found is None and (tls is True or url_says):
        raise ValueError(
            f"{where}: TLS asked for, but no certificate files: pass a memcache.TLS(ca=, cert=, key=) or "
            f"set {ENV_CA}, {ENV_CERT}, {ENV_KEY} (memcache tls-init makes them)"
        )
    return found

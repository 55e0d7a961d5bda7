"""Making the certificates of :mod:`memcache.tls`: a CA, and certificates it signs for nodes and clients.

Built on the ``cryptography`` package (X.509 and ECDSA P-256 keys: a key and a certificate take about a
millisecond). Two kinds of CA:

- **your own** (:func:`make_ca`, ``memcache tls-init DIR --hosts ...``): a random key written next to
  its certificate (``ca.key``, 0600); keep it off the nodes once their certificates are made.
- **a job's** (:func:`ca_from_secret`): the key is derived from the job's secret (HKDF-SHA256), so
  every node holding the secret builds the same CA on its own and signs its own certificates: nothing
  but the secret is shared, and a node without it has no certificate any server accepts. The CA is
  exactly as strong as the secret (so make the secret random, as the password already asks).

Certificates for nodes name the addresses clients dial (IP address or DNS SANs) and carry both
``serverAuth`` and ``clientAuth`` key usages: a node's Redis serves with the same certificate its
clients present. Files are written 0600 in a directory made 0700.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
from collections.abc import Iterable
from pathlib import Path

from memcache.tls import TLS

__all__ = ["make_ca", "load_ca", "ca_from_secret", "issue", "write_pem", "node_tls"]

# The order of NIST P-256's group: a derived scalar is reduced into [1, n-1].
_P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
_LEAF_DAYS = 3650  # a certificate lives as long as its CA's key is trusted: revoke by changing the CA
_SKEW = datetime.timedelta(days=1)  # nodes' clocks differ: valid from a day before it was made


def _x509():  # type: ignore[no-untyped-def]
    try:
        from cryptography import x509
    except ImportError as exc:  # pragma: no cover - a dependency; the message says how to get it
        raise ImportError(
            "TLS certificates need the 'cryptography' package: pip install cryptography"
        ) from exc
    return x509


def _new_key():  # type: ignore[no-untyped-def]
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _ca_cert(key, common_name: str):  # type: ignore[no-untyped-def]
    """A self-signed CA certificate; its name and serial follow from the key, so equal keys give equal CAs."""
    x509 = _x509()
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import NameOID

    pub = key.public_key()
    der = pub.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    tag = hashlib.sha256(der).hexdigest()[:16]
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{common_name} {tag}")])
    start = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(pub)
        .serial_number(int(tag, 16) | 1)
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=365 * 100))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # key_cert_sign, crl_sign
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(pub), critical=False)
        .sign(key, hashes.SHA256())
    )


def ca_from_secret(secret: bytes, label: str = "coordl job CA"):  # type: ignore[no-untyped-def]
    """``(key, certificate)`` of the CA every holder of ``secret`` derives alike (HKDF-SHA256 -> P-256)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    if len(secret) < 16:
        raise ValueError(f"a CA derived from a secret needs at least 16 bytes of it, got {len(secret)}")
    okm = HKDF(hashes.SHA256(), 48, salt=b"memcache-tls-ca-v1", info=label.encode()).derive(secret)
    key = ec.derive_private_key(int.from_bytes(okm, "big") % (_P256_ORDER - 1) + 1, ec.SECP256R1())
    return key, _ca_cert(key, label)


def _san(hosts: Iterable[str]):  # type: ignore[no-untyped-def]
    x509 = _x509()
    names = []
    for h in dict.fromkeys(h.strip("[]") for h in hosts if h):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(names)


def issue(ca_key, ca_cert, common_name: str, hosts: Iterable[str] = ()):  # type: ignore[no-untyped-def]
    """``(key, certificate)`` signed by the CA, naming ``hosts``, good for a server and a client."""
    x509 = _x509()
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = _new_key()
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _SKEW)
        .not_valid_after(now + datetime.timedelta(days=_LEAF_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, True, False, False, False, False), critical=True
        )  # digital_signature, key_agreement (ECDHE with an EC key)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    hosts = list(hosts)
    if hosts:
        builder = builder.add_extension(_san(hosts), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def write_pem(path: str | os.PathLike, obj) -> str:  # type: ignore[no-untyped-def]
    """Write a certificate or a private key as PEM, mode 0600 (replacing the file); returns the path."""
    from cryptography.hazmat.primitives import serialization

    if hasattr(obj, "private_bytes"):
        data = obj.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    else:
        data = obj.public_bytes(serialization.Encoding.PEM)
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return path


def _private_dir(directory: str | os.PathLike) -> Path:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


def make_ca(directory: str | os.PathLike, label: str = "memcache CA"):  # type: ignore[no-untyped-def]
    """A new random CA written as ``directory/ca.crt`` and ``ca.key`` (0600); ``(key, certificate)``."""
    d = _private_dir(directory)
    key = _new_key()
    cert = _ca_cert(key, label)
    write_pem(d / "ca.key", key)
    write_pem(d / "ca.crt", cert)
    return key, cert


def load_ca(directory: str | os.PathLike):  # type: ignore[no-untyped-def]
    """``(key, certificate)`` of the CA in ``directory`` (``ca.key``, ``ca.crt``)."""
    x509 = _x509()
    from cryptography.hazmat.primitives import serialization

    d = Path(directory)
    try:
        key = serialization.load_pem_private_key((d / "ca.key").read_bytes(), password=None)
        cert = x509.load_pem_x509_certificate((d / "ca.crt").read_bytes())
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"no CA in {d}: {exc.filename} is missing (memcache tls-init makes one)"
        ) from exc
    return key, cert


def node_tls(ca_key, ca_cert, directory: str | os.PathLike, name: str, hosts: Iterable[str] = ()) -> TLS:  # type: ignore[no-untyped-def]
    """Issue a certificate for ``hosts`` and write ``ca.crt``, ``<name>.crt``, ``<name>.key`` in ``directory``."""
    d = _private_dir(directory)
    key, cert = issue(ca_key, ca_cert, name, hosts)
    return TLS(
        ca=write_pem(d / "ca.crt", ca_cert),
        cert=write_pem(d / f"{name}.crt", cert),
        key=write_pem(d / f"{name}.key", key),
    )

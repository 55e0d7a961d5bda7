"""memcache.tls and memcache.certs without a server: the job CA follows from the secret alone, certificates
name their hosts and chain to their CA, files are private, and bad settings are clear errors."""

from __future__ import annotations

import os
import stat

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from memcache import certs
from memcache.tls import TLS, resolve, split_url


def _pub(cert) -> bytes:
    return cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def test_job_ca_is_the_same_for_the_same_secret_only() -> None:
    a_key, a = certs.ca_from_secret(b"s" * 32)
    _, a2 = certs.ca_from_secret(b"s" * 32)
    _, b = certs.ca_from_secret(b"t" * 32)
    assert _pub(a) == _pub(a2) and a.subject == a2.subject  # two nodes build the same CA on their own
    assert _pub(a) != _pub(b) and a.subject != b.subject
    with pytest.raises(ValueError, match="16 bytes"):
        certs.ca_from_secret(b"short")
    # A certificate one node issues verifies under the CA another node derived.
    _, leaf = certs.issue(a_key, a, "node", ["10.0.0.5", "node5.example"])
    leaf.verify_directly_issued_by(a2)
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.5"]
    assert san.get_values_for_type(x509.DNSName) == ["node5.example"]
    with pytest.raises(Exception):  # noqa: B017 - cryptography raises InvalidSignature or ValueError
        leaf.verify_directly_issued_by(b)


def test_files_are_private(tmp_path) -> None:
    key, cert = certs.make_ca(tmp_path / "pki")
    tls = certs.node_tls(key, cert, tmp_path / "pki", "n1", ["127.0.0.1"])
    for path in (tls.ca, tls.cert, tls.key, str(tmp_path / "pki" / "ca.key")):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    assert stat.S_IMODE(os.stat(tmp_path / "pki").st_mode) == 0o700
    again_key, again = certs.load_ca(tmp_path / "pki")
    assert _pub(again) == _pub(cert)
    with pytest.raises(FileNotFoundError, match="tls-init"):
        certs.load_ca(tmp_path / "nothing")


def test_settings_and_errors(tmp_path) -> None:
    key, cert = certs.make_ca(tmp_path)
    tls = certs.node_tls(key, cert, tmp_path, "n", ["127.0.0.1"])
    lines = tls.server_lines(6390)
    assert lines[:2] == ["port 0", "tls-port 6390"] and "tls-auth-clients yes" in lines
    assert tls.client_kwargs()["ssl_cert_reqs"] == "required" and tls.client_kwargs()["ssl_check_hostname"]
    with pytest.raises(FileNotFoundError, match="TLS key file"):
        TLS(ca=tls.ca, cert=tls.cert, key=str(tmp_path / "missing.key"))
    assert split_url("rediss://h:1") == ("h:1", True) and split_url("h:1") == ("h:1", None)
    with pytest.raises(ValueError, match="rediss://"):
        split_url("http://h:1")
    env = {"MEMCACHE_TLS_CA": tls.ca, "MEMCACHE_TLS_CERT": tls.cert}
    with pytest.raises(ValueError, match="MEMCACHE_TLS_KEY not set"):
        TLS.from_env(env)
    assert TLS.from_env({**env, "MEMCACHE_TLS_KEY": tls.key}) == tls
    assert resolve(False) is None and resolve(tls) is tls

"""The sample cache's Redis over TLS: works end to end, and refuses every client or server it should.

Real redis-server processes (Debian's build has TLS) with ``tls-port``, ``port 0`` and
``tls-auth-clients yes``; certificates from :mod:`memcache.certs`. Plus: the password never shows on a
command line, in the server's log, in a log record or in the error a wrong password raises.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from memcache import KeySpace, RedisStore, certs
from memcache.server import start_redis
from memcache.tls import TLS

pytestmark = pytest.mark.redis
PASSWORD = "tls-test-pw-5f1c9a0e77d2"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA with a server certificate for 127.0.0.1 and a client certificate, and another CA's pair."""
    root = tmp_path_factory.mktemp("pki")
    ca_key, ca_cert = certs.make_ca(root / "ca")
    other_key, other_cert = certs.make_ca(root / "other")
    return {
        "server": certs.node_tls(ca_key, ca_cert, root / "server", "server", ["127.0.0.1"]),
        "client": certs.node_tls(ca_key, ca_cert, root / "client", "client"),
        "foreign_client": certs.node_tls(other_key, other_cert, root / "foreign", "client"),
        "foreign_server": certs.node_tls(
            other_key, other_cert, root / "foreign_srv", "server", ["127.0.0.1"]
        ),
        "misnamed_server": certs.node_tls(ca_key, ca_cert, root / "misnamed", "server", ["10.99.0.1"]),
    }


@pytest.fixture
def tls_server(pki):
    server = start_redis(16 << 20, password=PASSWORD, tls=pki["server"])
    yield server
    server.stop()


def _items(n: int) -> dict[str, np.ndarray]:
    ks = KeySpace("synthetic", "tls")
    return {ks.key(i): np.full((8, 8, 3), i % 251, np.uint8) for i in range(n)}


def _ping(server, **kwargs) -> bool:
    client = redis.Redis(
        host=server.host,
        port=server.port,
        password=PASSWORD,
        socket_timeout=3,
        retry=Retry(NoBackoff(), 0),
        **kwargs,
    )
    try:
        return bool(client.ping())
    finally:
        client.close()


def test_sample_cache_round_trip_over_tls(pki):
    servers = [start_redis(16 << 20, password=PASSWORD, tls=pki["server"]) for _ in range(2)]
    try:
        store = RedisStore([s.address for s in servers], password=PASSWORD, tls=pki["client"])
        items = _items(100)
        assert store.put_many(items) == 100
        got = store.get_many(list(items))
        assert got.keys() == items.keys() and all(np.array_equal(got[k], v) for k, v in items.items())
        assert store.stats()["errors"] == 0
        store.close()
    finally:
        for s in servers:
            s.stop()


def test_rediss_url_and_environment(tls_server, pki, monkeypatch):
    client = pki["client"]
    monkeypatch.setenv("MEMCACHE_TLS_CA", client.ca)
    monkeypatch.setenv("MEMCACHE_TLS_CERT", client.cert)
    monkeypatch.setenv("MEMCACHE_TLS_KEY", client.key)
    store = RedisStore([f"rediss://{tls_server.address}"], password=PASSWORD)
    assert store.tls == client and "tls=True" in repr(store)
    assert store.put_many(_items(5)) == 5
    assert len(store.get_many(list(_items(5)))) == 5
    store.close()
    with pytest.raises(ValueError, match="rediss"):
        RedisStore([f"rediss://{tls_server.address}"], tls=False)


def test_rediss_without_files_is_a_clear_error(monkeypatch, tls_server):
    for name in ("MEMCACHE_TLS_CA", "MEMCACHE_TLS_CERT", "MEMCACHE_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="MEMCACHE_TLS_CA"):
        RedisStore([f"rediss://{tls_server.address}"])
    monkeypatch.setenv("MEMCACHE_TLS_CA", "/nonexistent/ca.crt")
    with pytest.raises(ValueError, match="MEMCACHE_TLS_CERT"):
        TLS.from_env()


def test_plain_text_is_refused(tls_server):
    with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
        _ping(tls_server)
    store = RedisStore([tls_server.address], password=PASSWORD, tls=False)
    assert store.put_many(_items(3)) == 0 and store.stats()["node_failures"] == 1


def test_client_without_certificate_is_refused(tls_server, pki):
    kwargs = {"ssl": True, "ssl_ca_certs": pki["client"].ca, "ssl_cert_reqs": "required"}
    with pytest.raises(redis.ConnectionError):
        _ping(tls_server, **kwargs)


def test_client_with_another_cas_certificate_is_refused(tls_server, pki):
    foreign = replace(pki["foreign_client"], ca=pki["client"].ca)  # trusts the server, presents a stranger
    with pytest.raises(redis.ConnectionError):
        _ping(tls_server, **foreign.client_kwargs())
    assert _ping(tls_server, **pki["client"].client_kwargs())  # the same call with our CA's cert works


@pytest.mark.parametrize("which", ["foreign_server", "misnamed_server"])
def test_client_refuses_a_wrong_server_certificate(pki, which):
    """Another CA's certificate, or ours naming another address: the client stops before AUTH."""
    server = start_redis(16 << 20, password=PASSWORD, tls=pki[which])
    try:
        with pytest.raises(redis.ConnectionError) as err:
            _ping(server, **pki["client"].client_kwargs())
        assert "certificate verify failed" in str(err.value)
        if which == "misnamed_server":  # the CA is right: only the name check refuses it
            assert _ping(server, **replace(pki["client"], check_hostname=False).client_kwargs())
    finally:
        server.stop()


def test_password_never_on_a_command_line_in_a_log_or_an_error(tls_server, pki, caplog):
    cmdline = Path(f"/proc/{tls_server.pid}/cmdline").read_bytes()
    assert PASSWORD.encode() not in cmdline
    assert PASSWORD not in repr(tls_server)
    with pytest.raises(redis.AuthenticationError) as err:
        redis.Redis(
            host=tls_server.host,
            port=tls_server.port,
            password="wrong-" + PASSWORD,
            **pki["client"].client_kwargs(),
        ).ping()
    assert PASSWORD not in str(err.value) and "wrong-" not in str(err.value)
    caplog.set_level(logging.DEBUG)
    bad = RedisStore([tls_server.address], password="wrong-" + PASSWORD, tls=pki["client"])
    assert bad.get_many(["mc1:x:1"]) == {} and bad.stats()["node_failures"] == 1
    assert "wrong-" not in caplog.text and PASSWORD not in caplog.text and "memcache" in caplog.text
    assert "wrong-" not in repr(bad)
    assert PASSWORD not in Path(tls_server.workdir, "redis.log").read_text()


def test_cli_tls_init_and_serve(tmp_path, monkeypatch):
    run = [sys.executable, "-m", "memcache.cli"]
    out = subprocess.run(
        [*run, "tls-init", str(tmp_path / "pki"), "--hosts", "127.0.0.1"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    env = {
        "MEMCACHE_TLS_CA": str(tmp_path / "pki" / "ca.crt"),
        "MEMCACHE_TLS_CERT": str(tmp_path / "pki" / "127.0.0.1.crt"),
        "MEMCACHE_TLS_KEY": str(tmp_path / "pki" / "127.0.0.1.key"),
        "MEMCACHE_PASSWORD": PASSWORD,
    }
    full_env = {**os.environ, **env}
    serve = subprocess.run(
        [*run, "serve", "--tls", "--maxmemory", "16M", "--dir", str(tmp_path / "srv")],
        capture_output=True, text=True, env=full_env,
    )  # fmt: skip
    assert serve.returncode == 0, serve.stderr
    assert "rediss://127.0.0.1:" in serve.stdout and PASSWORD not in serve.stdout + serve.stderr
    try:
        address = serve.stdout.split("serving rediss://")[1].split()[0]
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        client = replace(
            TLS.from_env(),
            cert=str(tmp_path / "pki" / "client.crt"),
            key=str(tmp_path / "pki" / "client.key"),
        )
        store = RedisStore([address], tls=client)
        assert store.put_many(_items(2)) == 2
    finally:
        subprocess.run([*run, "stop", "--dir", str(tmp_path / "srv")], capture_output=True, check=True)


def test_cli_serve_tls_makes_a_host_ca_when_given_no_files(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMCACHE_TLS_")}
    env.update(TMPDIR=str(tmp_path), MEMCACHE_PASSWORD=PASSWORD)
    run = [sys.executable, "-m", "memcache.cli"]
    serve = subprocess.run(
        [*run, "serve", "--tls", "--maxmemory", "16M", "--dir", str(tmp_path / "srv")],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert serve.returncode == 0, serve.stderr
    try:
        exports = next(ln for ln in serve.stdout.splitlines() if "export MEMCACHE_TLS_CA=" in ln)
        files = dict(kv.split("=", 1) for kv in exports.split("export ", 1)[1].split())
        ca_dir = tmp_path / f"memcache-{os.getuid()}" / "tls"
        assert Path(files["MEMCACHE_TLS_CA"]).parent == ca_dir and (ca_dir / "ca.key").exists()
        address = serve.stdout.split("serving rediss://")[1].split()[0]
        tls = TLS(files["MEMCACHE_TLS_CA"], files["MEMCACHE_TLS_CERT"], files["MEMCACHE_TLS_KEY"])
        store = RedisStore([f"rediss://{address}"], password=PASSWORD, tls=tls)
        assert store.put_many(_items(2)) == 2
        store.close()
    finally:
        subprocess.run([*run, "stop", "--dir", str(tmp_path / "srv")], capture_output=True, check=True)

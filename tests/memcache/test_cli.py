"""`memcache serve` / `memcache stop` start and stop a configured redis-server."""

from __future__ import annotations

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from memcache.cli import main, parse_bytes

pytestmark = pytest.mark.redis


def test_parse_bytes():
    assert parse_bytes("16G") == 16 << 30 and parse_bytes("512m") == 512 << 20 and parse_bytes("100") == 100


def test_serve_then_stop(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MEMCACHE_PASSWORD", "pw123")
    d = tmp_path / "node"
    assert main(["serve", "--maxmemory", "8M", "--dir", str(d)]) == 0
    out = capsys.readouterr().out
    address = out.split("serving ")[1].split()[0]
    host, port = address.rsplit(":", 1)
    try:
        r = redis.Redis(host=host, port=int(port), password="pw123")
        assert r.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        assert int(r.config_get("maxmemory")["maxmemory"]) == 8 << 20
        assert r.config_get("save")["save"] == ""
        assert "pw123" not in (d / "redis.log").read_text()
        assert oct((d / "redis.conf").stat().st_mode & 0o777) == "0o600"
    finally:
        assert main(["stop", "--dir", str(d)]) == 0
    with pytest.raises(redis.ConnectionError):
        redis.Redis(host=host, port=int(port), socket_timeout=1, retry=Retry(NoBackoff(), 0)).ping()


def test_serve_without_maxmemory_uses_a_quarter_of_the_machine_and_says_so(tmp_path, capsys):
    import psutil

    from memcache.cli import default_maxmemory

    assert default_maxmemory() == int(psutil.virtual_memory().total * 0.25)
    d = tmp_path / "node"
    assert main(["serve", "--dir", str(d)]) == 0  # as the README shows it: no arguments needed
    try:
        out = capsys.readouterr().out
        assert "no --maxmemory given: using" in out and "a quarter of this machine's memory" in out
        address = out.split("serving ")[1].split()[0]
        host, port = address.rsplit(":", 1)
        r = redis.Redis(host=host, port=int(port))
        assert int(r.config_get("maxmemory")["maxmemory"]) == default_maxmemory()
    finally:
        assert main(["stop", "--dir", str(d)]) == 0

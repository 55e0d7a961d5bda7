"""Fixtures: real redis-server processes on free loopback ports, and a private LocalStore directory."""

from __future__ import annotations

import pytest

from memcache.server import start_redis


@pytest.fixture
def redis_nodes():
    """Three redis-server processes standing for three nodes (16 MiB each); stopped by pid in teardown."""
    servers = []
    try:
        for _ in range(3):
            servers.append(start_redis(16 << 20))
        yield servers
    finally:
        for s in servers:
            s.stop()


@pytest.fixture
def shm_dir(tmp_path):
    """A private directory for LocalStore files, so tests never see each other's stores."""
    return tmp_path

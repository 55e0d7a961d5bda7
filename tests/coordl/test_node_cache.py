"""The ranks of a node share one MinIO cache (coordl.fetch.node_cache): created once, attached, counted."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from coordl.fetch import node_cache
from coordl.fetch.node_cache import close_minio, data_identity, node_key, open_minio


@pytest.fixture
def job(monkeypatch: pytest.MonkeyPatch, tmp_path) -> dict[str, str]:
    """The environment torchrun gives a rank of a 2-rank job (a port unique to this test run)."""
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(20000 + os.getpid() % 20000), "WORLD_SIZE": "2"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


def test_outside_a_distributed_job_each_loader_has_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert node_key("id:x", 1 << 20, 10, None) is None
    a = open_minio(1 << 20, 10, directory=None, name="t", identity="id:x")
    b = open_minio(1 << 20, 10, directory=None, name="t", identity="id:x")
    assert a is not b and a.paths != b.paths
    close_minio(a)
    close_minio(b)


def test_a_dataset_that_cannot_name_its_data_is_never_shared(job: dict[str, str]) -> None:
    class Anonymous:
        def __len__(self) -> int:
            return 3

    assert data_identity(Anonymous()) is None
    assert node_key(None, 1 << 20, 3, None) is None


def test_loaders_of_one_process_share_one_cache_until_the_last_closes(job: dict[str, str]) -> None:
    a = open_minio(1 << 20, 10, directory=None, name="t", identity="id:shared-1")
    b = open_minio(1 << 20, 10, directory=None, name="t", identity="id:shared-1")
    assert a is b
    path = a.paths[0]
    a.put(3, b"abc")
    close_minio(a)
    assert os.path.exists(path) and bytes(b.get(3)) == b"abc"  # still in use by the second loader
    close_minio(b)
    assert not os.path.exists(path)
    assert not any(k for k in node_cache._OPEN if node_cache._OPEN[k][0] is a)
    rendezvous = node_cache._rendezvous(node_key("id:shared-1", 1 << 20, 10, None), None)
    assert not os.path.exists(rendezvous)


def test_another_rank_attaches_to_the_same_cache(job: dict[str, str]) -> None:
    cache = open_minio(1 << 20, 10, directory=None, name="t", identity="id:shared-2")
    cache.put(1, b"from rank 0")
    child = textwrap.dedent(
        """
        from coordl.fetch.node_cache import close_minio, open_minio
        c = open_minio(1 << 20, 10, directory=None, name="t", identity="id:shared-2")
        print(c.paths[0]); print(bytes(c.get(1)).decode()); c.put(2, b"from rank 1"); close_minio(c)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, env={**os.environ, **job}, timeout=60
    )
    assert out.returncode == 0, out.stderr
    path, seen = out.stdout.split("\n")[:2]
    assert path == cache.paths[0] and seen == "from rank 0"
    assert bytes(cache.get(2)) == b"from rank 1"  # one table: what either rank caches, both hit
    assert os.path.exists(cache.paths[0])  # the other rank closing does not free the creator's cache
    close_minio(cache)


def test_a_stale_rendezvous_is_replaced(job: dict[str, str]) -> None:
    key = node_key("id:stale", 1 << 20, 10, None)
    where = node_cache._rendezvous(key, None)
    with open(where, "w") as f:
        f.write("/dev/shm/coordl-minio-1-1-deadbeef")  # a creator that is gone
    cache = open_minio(1 << 20, 10, directory=None, name="t", identity="id:stale")
    with open(where) as f:
        assert f.read() == cache.paths[0]
    close_minio(cache)
    assert not os.path.exists(where)


def test_a_process_that_exits_without_closing_leaves_no_rendezvous(job: dict[str, str]) -> None:
    child = textwrap.dedent(
        """
        from coordl.fetch import node_cache
        from coordl.fetch.node_cache import node_key, open_minio
        c = open_minio(1 << 20, 10, directory=None, name="t", identity="id:exit")
        print(node_cache._rendezvous(node_key("id:exit", 1 << 20, 10, None), None))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, env={**os.environ, **job}, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert not os.path.exists(out.stdout.strip())


def test_rendezvous_of_killed_jobs_are_swept_at_the_next_open(job: dict[str, str]) -> None:
    leftover = os.path.join("/dev/shm", "coordl-nodecache-00000000000000000000")
    with open(leftover, "w") as f:
        f.write("/dev/shm/coordl-minio-1-1-deadbeef")  # its creator was killed before its exit hooks ran
    cache = open_minio(1 << 20, 10, directory=None, name="t", identity="id:sweep")
    assert not os.path.exists(leftover)
    close_minio(cache)

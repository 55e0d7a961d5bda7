"""The partitioned cache's Redis over TLS, two real ranks (gloo on loopback): items cross nodes over TLS;
plain text, a client without a certificate, one of another CA, and one that derived its CA from
another secret are all refused; the job's password is on no command line, in no log; a node in plain
text beside one with TLS is one clear error; a shared ``rediss://`` Redis with your own files works."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from coordl.partitioned import peer_tls
from memcache import certs
from memcache.server import start_redis
from tests.coordl.partitioned.ranks import JOB_SECRET, results, run_two_ranks

pytestmark = pytest.mark.redis

RANK_SCRIPT = r"""
import datetime, json, logging, io, os, sys, tempfile
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
import torch.distributed as dist
import coordl.partitioned.ownership as own
import coordl.partitioned.tier as part
from coordl.errors import CoordlError
from coordl.fetch.minio import MinioCache
from memcache import certs
from shmem.counters import SharedCounters

logs = io.StringIO()
logging.basicConfig(stream=logs, level=logging.DEBUG)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
n = 40
try:
    tier = part.build_partitioned_tier(n, 1 << 20, SharedCounters(["cache_hits", "cache_misses"]),
                                       MinioCache(1 << 20, n), seed=3, identity="tls-test")
except CoordlError as exc:
    print("ERROR", exc, flush=True)
    sys.exit(3)
theirs = [i for i in range(n) if tier.owners.owner(i) == 1 - rank]
for i in theirs:
    tier.offer(i, bytes([i]) * 100)
tier.flush()
dist.barrier()
got = tier.client.fetch({1 - rank: theirs})  # read back from the other node's Redis, over TLS
out = {"pushed": len(theirs), "read": sum(bytes(got[i]) == bytes([i]) * 100 for i in got),
       "tls": tier.client.tls is not None}
if rank == 0 and tier.server is not None:
    host, port = tier.client.addresses[1]
    password = tier.client.password

    def refused(**kw):
        c = redis.Redis(host=host, port=port, password=password, socket_timeout=3, retry=Retry(NoBackoff(), 0), **kw)
        try:
            c.ping()
            return "accepted"
        except (redis.RedisError, OSError) as exc:
            return str(exc)
        finally:
            c.close()

    own_tls = tier.client.tls
    d = tempfile.mkdtemp()
    stranger = certs.node_tls(*certs.make_ca(d + "/ca"), d + "/s", "client")
    k, c = certs.ca_from_secret(b"another job secret, 32 bytes long")
    other_job = certs.node_tls(k, c, d + "/o", "client")
    out["probe"] = {
        "ours": refused(**own_tls.client_kwargs()),
        "plain": refused(),
        "no_cert": refused(ssl=True, ssl_ca_certs=own_tls.ca, ssl_cert_reqs="required"),
        "other_ca_cert": refused(**dict(stranger.client_kwargs(), ssl_ca_certs=own_tls.ca)),
        "other_secret": refused(**other_job.client_kwargs()),
    }
    srv = tier.server
    out["password_in"] = {
        "cmdline": password.encode() in open(f"/proc/{srv.pid}/cmdline", "rb").read(),
        "redis_log": password in open(os.path.join(srv.workdir, "redis.log")).read(),
        "repr": password in repr(srv) or password in repr(tier.client.tls),
    }
    secret = os.environ.get("COORDL_PEER_SECRET", "")
    out["secret_in"] = {
        "cmdline": bool(secret) and secret.encode() in open(f"/proc/{srv.pid}/cmdline", "rb").read(),
        "redis_log": bool(secret) and secret in open(os.path.join(srv.workdir, "redis.log")).read(),
    }
dist.barrier()
tier.close()
dist.destroy_process_group()
out["password_in_logs"] = tier.client.password in logs.getvalue() if tier.client.password else False
out["secret_in_logs"] = bool(os.environ.get("COORDL_PEER_SECRET")) and os.environ["COORDL_PEER_SECRET"] in logs.getvalue()
out["logs_say_tls"] = "over TLS" in logs.getvalue()
print("RESULT", json.dumps(out), flush=True)
"""


LOADER_SCRIPT = r"""
import datetime, json, os
import torch.distributed as dist
import coordl

class Items:
    def __len__(self): return 96
    def fetch(self, i): return (i.to_bytes(4, "little") * 2500)[: 5000 + i]
    def prep(self, raw, i):
        assert raw == self.fetch(i), i
        return i

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
loader = coordl.DataLoader(Items(), batch_size=8, shuffle=True, num_workers=1, cache_bytes=600_000,
                           partitioned=True)
reads, seen = [], []
for epoch in range(2):
    loader.sampler.set_epoch(epoch)
    seen.append(sorted(int(i) for b in loader for i in b))
    dist.barrier()
    reads.append(loader.epoch_stats()[-1]["storage_items_read"])
st = loader.stats()
print("RESULT", json.dumps({"reads": reads, "seen": seen, "remote_hits": st["remote_hits"],
                            "remote_errors": st["remote_errors"]}), flush=True)
loader.close()
dist.destroy_process_group()
"""


TLS_ENV = {"COORDL_PEER_TLS": "1", "COORDL_PEER_SECRET": JOB_SECRET}


def test_job_certificates_carry_items_and_refuse_strangers(tmp_path: Path) -> None:
    r0, r1 = results(run_two_ranks(tmp_path, [TLS_ENV, TLS_ENV], RANK_SCRIPT))
    for r in (r0, r1):
        assert r["tls"] and r["logs_say_tls"] and r["pushed"] > 0
        assert r["read"] == r["pushed"]  # every item pushed over TLS read back over TLS, bytes equal
        assert r["password_in_logs"] is False and r["secret_in_logs"] is False
    probe = r0["probe"]
    assert probe["ours"] == "accepted"
    assert probe["plain"] != "accepted" and probe["no_cert"] != "accepted"
    assert probe["other_ca_cert"] != "accepted"
    assert "certificate verify failed" in probe["other_secret"]  # the client refuses the server's cert
    assert r0["password_in"] == {"cmdline": False, "redis_log": False, "repr": False}
    assert r0["secret_in"] == {"cmdline": False, "redis_log": False}


def test_plain_node_beside_a_tls_node_is_one_clear_error(tmp_path: Path) -> None:
    runs = run_two_ranks(tmp_path, [TLS_ENV, {"COORDL_PEER_SECRET": JOB_SECRET}], RANK_SCRIPT)
    for rc, out, err in runs:
        assert rc == 3, err[-2000:]
        assert "node(s) 1 run their Redis in plain text" in out and "Traceback" not in err


def test_shared_rediss_redis_with_your_own_files(tmp_path: Path) -> None:
    """``memcache serve --tls``-style servers, ``COORDL_PEER_REDIS=rediss://...`` and MEMCACHE_TLS_*."""
    ca_key, ca_cert = certs.make_ca(tmp_path / "pki")
    node = certs.node_tls(ca_key, ca_cert, tmp_path / "pki", "127.0.0.1", ["127.0.0.1"])
    password = "shared-tls-redis-0123456789"
    servers = [start_redis(64 << 20, password=password, tls=node) for _ in range(2)]
    files = {"MEMCACHE_TLS_CA": node.ca, "MEMCACHE_TLS_CERT": node.cert, "MEMCACHE_TLS_KEY": node.key}
    try:
        envs = [
            {"COORDL_PEER_REDIS": f"rediss://{s.address}", "MEMCACHE_PASSWORD": password, **files}
            for s in servers
        ]
        r0, r1 = results(run_two_ranks(tmp_path, envs, RANK_SCRIPT))  # no COORDL_PEER_SECRET: not needed
    finally:
        for s in servers:
            s.stop()
    assert r0["tls"] and r1["tls"] and r0["read"] == r0["pushed"] > 0 and r1["read"] == r1["pushed"] > 0


def test_dataloader_with_workers_over_tls(tmp_path: Path) -> None:
    """coordl.DataLoader(partitioned=True) with COORDL_PEER_TLS=1: its workers (copies of the client)
    read peers over TLS; storage is read in epoch 1 only."""
    r0, r1 = results(run_two_ranks(tmp_path, [TLS_ENV] * 2, LOADER_SCRIPT))
    for e in range(2):
        assert sorted(r0["seen"][e] + r1["seen"][e]) == list(range(96))
    assert r0["reads"][1] + r1["reads"][1] == 0 and r0["reads"][0] + r1["reads"][0] == 96
    assert r0["remote_hits"] + r1["remote_hits"] > 0 and r0["remote_errors"] == r1["remote_errors"] == 0


def test_coordl_peer_tls_variable() -> None:
    assert peer_tls.wanted(None, {}) is False
    assert peer_tls.wanted(None, {"COORDL_PEER_TLS": "1"}) is True  # the job's own certificates
    assert peer_tls.wanted(False, {"COORDL_PEER_TLS": "1"}) is False
    with pytest.raises(ValueError, match="COORDL_PEER_TLS='maybe'"):
        peer_tls.wanted(None, {"COORDL_PEER_TLS": "maybe"})


def test_a_killed_processs_tls_directory_is_reclaimed(tmp_path: Path, monkeypatch) -> None:
    """A rank killed with SIGKILL leaves its client key behind; the next one made on the host removes it."""
    import tempfile

    from shmem.segment import owner_tag

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    tag = owner_tag(victim.pid)
    victim.kill()
    victim.wait()
    dead = tmp_path / f"coordl-tls-{tag}-x1"
    dead.mkdir()
    (dead / "client.key").write_text("a key of a job's CA")
    tls = peer_tls.client_tls(b"s" * 32)
    assert not dead.exists()
    assert Path(tls.key).exists() and Path(tls.key).parent.name.startswith(f"coordl-tls-{owner_tag()}-")

"""TLS for the partitioned cache asked for by keyword, ``partitioned=coordl.PartitionedOptions(tls=True)``,
and the job's CA never derived from a secret that crossed the rendezvous: across nodes without
``COORDL_PEER_SECRET`` the job is refused on every rank, with an error naming the variable."""

from __future__ import annotations

import pytest

import coordl
from coordl.errors import CoordlError
from coordl.fetch import chain
from coordl.fetch.pipeline import BASE_COUNTERS
from coordl.partitioned import rendezvous
from coordl.partitioned.options import PUSH_WAIT_S, PartitionedOptions
from coordl.partitioned.ownership import NodeTopology
from shmem.counters import SharedCounters
from tests.coordl.partitioned.ranks import JOB_SECRET, results, run_two_ranks

LOADER_SCRIPT = r"""
import datetime, io, json, logging, os, sys
import redis
import torch.distributed as dist
import coordl
from coordl.errors import CoordlError

class Items:
    def __len__(self): return 64
    def fetch(self, i): return (i.to_bytes(4, "little") * 2500)[: 4000 + i]
    def prep(self, raw, i):
        assert raw == self.fetch(i), i
        return i

logs = io.StringIO()
logging.basicConfig(stream=logs, level=logging.DEBUG)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
try:
    loader = coordl.DataLoader(Items(), batch_size=8, shuffle=True, num_workers=1, cache_bytes=400_000,
                               partitioned=coordl.PartitionedOptions(tls=True))
except CoordlError as exc:
    print("ERROR", exc, flush=True)
    sys.exit(3)
reads, seen = [], []
for epoch in range(2):
    loader.sampler.set_epoch(epoch)
    seen.append(sorted(int(i) for b in loader for i in b))
    dist.barrier()
    reads.append(loader.epoch_stats()[-1]["storage_items_read"])
client = loader._chain.tiers[0].client
host, port = client.addresses[1 - dist.get_rank()]
try:  # the other node's Redis in plain text, with the right password: refused (no plain-text port)
    redis.Redis(host=host, port=port, password=client.password, socket_timeout=3).ping()
    plain = "accepted"
except (redis.RedisError, OSError) as exc:
    plain = type(exc).__name__
st = loader.stats()
loader.close()
dist.destroy_process_group()
secret = os.environ["COORDL_PEER_SECRET"]
print("RESULT", json.dumps({
    "reads": reads, "seen": seen, "remote_hits": st["remote_hits"], "remote_errors": st["remote_errors"],
    "tls": client.tls is not None, "plain": plain, "logs_say_tls": "over TLS" in logs.getvalue(),
    "secret_in_logs": secret in logs.getvalue() or client.password in logs.getvalue(),
}), flush=True)
"""


@pytest.mark.redis
def test_keyword_tls_over_two_nodes(tmp_path) -> None:
    """Two real ranks, each a node: items cross over TLS, asked for by the keyword alone; the keyword
    wins over ``COORDL_PEER_TLS=0``; the nodes' Redis refuse plain text; storage is read once."""
    env = {"COORDL_PEER_SECRET": JOB_SECRET, "COORDL_PEER_TLS": "0"}
    r0, r1 = results(run_two_ranks(tmp_path, [env, env], LOADER_SCRIPT))
    for e in range(2):
        assert sorted(r0["seen"][e] + r1["seen"][e]) == list(range(64))
    assert r0["reads"][0] + r1["reads"][0] == 64 and r0["reads"][1] + r1["reads"][1] == 0
    assert r0["remote_hits"] + r1["remote_hits"] > 0 and r0["remote_errors"] == r1["remote_errors"] == 0
    for r in (r0, r1):
        assert r["tls"] and r["logs_say_tls"] and r["plain"] != "accepted"
        assert r["secret_in_logs"] is False


@pytest.mark.redis
@pytest.mark.parametrize("secrets", [("", ""), (JOB_SECRET, "")], ids=["none", "rank0-only"])
def test_keyword_tls_across_nodes_without_the_secret_is_refused(tmp_path, secrets) -> None:
    """No ``COORDL_PEER_SECRET`` (or on one rank only): both ranks fail at start-up, the same error
    naming the variable and the node(s) without it; no traceback; the secret shows nowhere."""
    envs = [{"COORDL_PEER_SECRET": s} if s else {} for s in secrets]
    runs = run_two_ranks(tmp_path, envs, LOADER_SCRIPT)
    for rc, out, err in runs:
        assert rc == 3, err[-2000:]
        line = next(ln for ln in out.splitlines() if ln.startswith("ERROR"))
        assert "needs COORDL_PEER_SECRET, the same on every rank" in line
        assert ("node(s) 0, 1 have none" if secrets[0] == "" else "node(s) 1 have none") in line
        assert "Traceback" not in err and JOB_SECRET not in out + err


def _exchange(monkeypatch, topo: NodeTopology, user_secret: bytes | None, **kw):
    """:func:`rendezvous.exchange` on one rank, the all_gather replaced by this rank's record twice over
    (both node leaders alike), returning what the record said and the outcome."""
    sent: list[str] = []

    def gather(world_size: int, record: str) -> list[str]:
        sent.append(record)
        other = record.replace(f"{topo.node} ", f"{1 - topo.node} ", 1)
        return [record, other] if topo.node == 0 else [other, record]

    monkeypatch.setattr(rendezvous, "_all_gather_text", gather)
    mine = ("127.0.0.1", 6379, False, "ok")
    return sent, rendezvous.exchange(topo, mine, user_secret, 10, 1 << 20, 0, **kw)


def test_rank0_sends_no_secret_when_the_ca_would_come_from_it(monkeypatch) -> None:
    """TLS with the job's CA on 2 nodes and no user secret: rank 0 makes none, so none crosses the wire."""
    two_nodes = NodeTopology(0, 2, 0, 1, 0, 2)
    with pytest.raises(CoordlError, match="COORDL_PEER_SECRET") as info:
        _exchange(monkeypatch, two_nodes, None, tls=True, secret_ca=True)
    assert "node(s) 0, 1 have none" in str(info.value)
    sent, agreed = _exchange(monkeypatch, two_nodes, None, tls=True, secret_ca=False)  # your own files
    assert sent[-1].split()[7] == agreed.secret.hex()  # the password then crosses: files gate access
    sent, agreed = _exchange(monkeypatch, two_nodes, JOB_SECRET.encode(), tls=True, secret_ca=True)
    assert sent[-1].split()[7] == "-" and agreed.secret == JOB_SECRET.encode()


def test_one_node_with_several_ranks_needs_no_secret(monkeypatch) -> None:
    """All ranks on one node: the rendezvous stays on the host, rank 0 may make the secret."""
    one_node = NodeTopology(0, 2, 0, 2, 0, 1)
    monkeypatch.setattr(rendezvous, "_all_gather_text", lambda world, record: [record, ""])
    agreed = rendezvous.exchange(one_node, ("127.0.0.1", 6379, False, "ok"), None, 10, 1, 0, tls=True,
                                 secret_ca=True)  # fmt: skip
    assert len(agreed.secret) == 32


def test_partitioned_option_checks() -> None:
    with pytest.raises(TypeError, match=r"PartitionedOptions\(tls=\) must be"):
        PartitionedOptions(tls="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="partitioned must be True, False or a coordl.PartitionedOptions"):
        coordl.DataLoader(list(range(4)), partitioned="yes")  # type: ignore[arg-type]
    assert coordl.PartitionedOptions is PartitionedOptions
    assert PartitionedOptions(tls=True) == PartitionedOptions(tls=True)  # frameworks compare loader options


class _Items:
    def __len__(self) -> int:
        return 8

    def fetch(self, i: int) -> bytes:
        return bytes([i]) * 10

    def prep(self, raw: bytes, i: int) -> int:
        return i


class _Tier:
    name = "partitioned"

    def stats(self) -> dict:
        return {}


def test_the_chain_passes_the_settings_to_the_tier(monkeypatch) -> None:
    """``partitioned=`` reaches :func:`build_partitioned_tier` as its arguments (no hidden channel);
    True leaves TLS to the environment; False builds no tier."""
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        monkeypatch.delenv(k, raising=False)
    seen: list[dict] = []

    def build(num_items, cache_bytes, counters, local_cache, **kw):  # noqa: ANN001, ANN202
        seen.append(kw)
        return _Tier()

    monkeypatch.setattr(chain, "build_partitioned_tier", build)
    counters = SharedCounters(BASE_COUNTERS)
    try:
        for value in (PartitionedOptions(tls=True, push_wait_s=2.5), True, False):
            made = chain.FetchChain(_Items(), counters, cache_bytes=1 << 20, partitioned=value)
            assert [t.name for t in made.tiers] == (["minio"] if value is False else ["partitioned"])
            made.close()
    finally:
        counters.close()
    assert [(kw["tls"], kw["push_wait_s"]) for kw in seen] == [(True, 2.5), (None, PUSH_WAIT_S)]
    with pytest.raises(ValueError, match=r"push_wait_s=\) must be a number of seconds >= 0, got -1"):
        PartitionedOptions(push_wait_s=-1)

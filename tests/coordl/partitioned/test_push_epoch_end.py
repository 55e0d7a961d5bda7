"""Items read from storage reach their owners before the next epoch: the end of each epoch waits for the
pushes still in flight (bounded), so storage is read in the first epoch only, even over a slow link; a
dead or frozen owner, or a worker that died with pushes queued, does not hang it."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Sequence

import pytest

from coordl.fetch.minio import MinioCache
from coordl.partitioned.fetch import PartitionedTier
from coordl.partitioned.ownership import OwnerMap, PartitionedSampler
from coordl.partitioned.redis_peer import PEER_COUNTERS, RedisPeerClient, key_prefix
from memcache.server import start_redis
from shmem.counters import SharedCounters
from tests.coordl.partitioned.ranks import JOB_SECRET, results, run_two_ranks

# -- the loader, two real ranks (gloo), each a node, pushes over a slow link ----------------------------

SLOW_LINK_SCRIPT = r"""
import datetime, json, os, time
import torch.distributed as dist
import coordl
from coordl.partitioned.redis_peer import RedisPeerClient

# A slow link to the owners for what is sent in the background: every pipelined push waits first
# (workers are forked: they inherit it).
_put_many = RedisPeerClient.put_many
def slow_put_many(self, node, items):
    time.sleep(float(os.environ["PUSH_DELAY_S"]))
    return _put_many(self, node, items)
RedisPeerClient.put_many = slow_put_many

class Items:
    def __len__(self): return 64
    def fetch(self, i): return (i.to_bytes(4, "little") * 500)[: 1000 + i]
    def prep(self, raw, i):
        assert raw == self.fetch(i), i
        return i

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
workers = int(os.environ["WORKERS"])
loader = coordl.DataLoader(Items(), batch_size=8, shuffle=True, num_workers=workers,
                           persistent_workers=workers > 0, cache_bytes=200_000,
                           partitioned=coordl.PartitionedOptions(push_wait_s=60))
reads, seen, ends = [], [], []
for epoch in range(3):
    loader.sampler.set_epoch(epoch)
    seen.append(sorted(int(i) for b in loader for i in b))
    ends.append(time.monotonic())
    dist.barrier()  # as a training loop's collectives do: every rank ends the epoch, then the next starts
    reads.append(loader.epoch_stats()[-1]["storage_items_read"])
st = loader.stats()
loader.close()
dist.destroy_process_group()
print("RESULT", json.dumps({"reads": reads, "seen": seen, "remote_hits": st["remote_hits"],
                            "remote_errors": st["remote_errors"], "late": st["remote_push_late"],
                            "waited_ms": st["remote_push_wait_ms"]}), flush=True)
"""


@pytest.mark.redis
@pytest.mark.parametrize(
    "workers", [1, pytest.param(0, marks=pytest.mark.slow)], ids=["persistent-worker", "main-process"]
)
def test_storage_is_not_read_after_the_first_epoch_over_a_slow_link(tmp_path, workers: int) -> None:
    """Every push waits 0.5 s (a slow link): the first epoch ends long before its items reach their
    owners. Before the fix the second epoch read most of them from storage again; now its end waits."""
    env = {"COORDL_PEER_SECRET": JOB_SECRET, "PUSH_DELAY_S": "0.5", "WORKERS": str(workers)}
    r0, r1 = results(run_two_ranks(tmp_path, [env, env], SLOW_LINK_SCRIPT))
    for e in range(3):
        assert sorted(r0["seen"][e] + r1["seen"][e]) == list(range(64))
    assert r0["reads"][0] + r1["reads"][0] == 64  # every item once, in the first epoch
    assert [r0["reads"][e] + r1["reads"][e] for e in (1, 2)] == [0, 0]
    assert r0["remote_hits"] + r1["remote_hits"] > 0 and r0["remote_errors"] == r1["remote_errors"] == 0
    assert r0["late"] == r1["late"] == 0
    assert r0["waited_ms"] + r1["waited_ms"] >= 400  # the first epoch's end did wait for the slow link


# -- the tier: two nodes in one process, a Redis each -------------------------------------------------

N_ITEMS = 60
PASSWORD = "partition-test-secret-0123456789"
PREFIX = key_prefix("test-push-epoch-end")


def _item(i: int) -> bytes:
    return bytes([i % 251]) * (100 + i)


class DelayedLink(RedisPeerClient):
    """A client whose pushes cross a slow link: each pipelined push waits ``delay_s`` first."""

    delay_s = 0.0

    def put_many(self, node: int, items: Sequence[tuple[int, bytes | memoryview]]) -> int:
        time.sleep(self.delay_s)
        return super().put_many(node, items)


class Nodes:
    """Two node leaders in this process, each with its MinIO cache, its Redis and a delayed link."""

    def __init__(self, delay_s: float, push_wait_s: float, timeout_s: float = 2.0) -> None:
        self.owners = OwnerMap(N_ITEMS, num_nodes=2, seed=11)
        self.caches = [MinioCache(200 * N_ITEMS, N_ITEMS) for _ in range(2)]
        self.servers = [start_redis(16 << 20, password=PASSWORD) for _ in range(2)]
        addrs = [(s.host, s.port) for s in self.servers]
        self.base = [SharedCounters(["cache_hits", "cache_misses"]) for _ in range(2)]
        self.tiers = []
        for k in range(2):
            link = DelayedLink(addrs, password=PASSWORD, prefix=PREFIX, timeout_s=timeout_s, backoff_s=60)
            link.delay_s = delay_s
            self.tiers.append(
                PartitionedTier(
                    self.owners,
                    k,
                    link,
                    self.base[k],
                    local_cache=self.caches[k],
                    peer_counters=SharedCounters(PEER_COUNTERS),
                    mirror_local=True,
                    push_wait_s=push_wait_s,
                )  # fmt: skip
            )
        self.storage_reads = 0
        self.frozen: list[int] = []

    def freeze(self, node: int) -> None:
        """Node ``node``'s Redis stops answering (SIGSTOP; resumed at :meth:`close`)."""
        self.frozen.append(self.servers[node].pid)
        os.kill(self.frozen[-1], signal.SIGSTOP)

    def epoch(self, epoch: int, end: bool = True) -> int:
        """Both nodes read their shard (storage for what no cache has); then each ends its epoch."""
        before = self.storage_reads
        for node, tier in enumerate(self.tiers):
            s = PartitionedSampler(N_ITEMS, 2, node, seed=5)
            s.set_epoch(epoch)
            for i in s:
                raw = tier.get(i)
                if raw is None:
                    self.storage_reads += 1
                    tier.offer(i, _item(i))
                else:
                    assert bytes(raw) == _item(i)
        if end:
            for tier in self.tiers:
                tier.end_epoch()
        return self.storage_reads - before

    def close(self) -> None:
        for pid in self.frozen:
            os.kill(pid, signal.SIGCONT)
        for t in self.tiers:
            t.close()
            t.peer_counters.close()
        for s in self.servers:
            s.stop()
        for c in self.caches:
            c.close()
        for b in self.base:
            b.close()


@pytest.fixture
def make_nodes():
    made: list[Nodes] = []

    def make(*args, **kw) -> Nodes:
        made.append(Nodes(*args, **kw))
        return made[-1]

    yield make
    for nodes in made:
        nodes.close()


@pytest.mark.redis
def test_the_epoch_end_waits_for_pushes_on_a_slow_link(make_nodes) -> None:
    nodes = make_nodes(delay_s=0.3, push_wait_s=30)
    t0 = time.monotonic()
    assert nodes.epoch(0) == N_ITEMS
    assert time.monotonic() - t0 >= 0.3  # it waited for at least one delayed push
    assert nodes.epoch(1) == 0 and nodes.epoch(2) == 0
    st = nodes.tiers[0].stats()
    assert st["remote_push_late"] == 0 and st["remote_push_wait_ms"] >= 300
    assert "push_queued" not in st  # the bookkeeping stays inside


@pytest.mark.redis
def test_without_the_wait_the_next_epoch_reads_storage_again(make_nodes) -> None:
    """The race the wait closes, shown: the same run with no wait at the epoch's end."""
    nodes = make_nodes(delay_s=0.3, push_wait_s=30)
    assert nodes.epoch(0, end=False) == N_ITEMS
    assert nodes.epoch(1) > 0


@pytest.mark.redis
def test_a_frozen_owner_does_not_hang_the_epoch_end(make_nodes, caplog) -> None:
    """Node 1's Redis stops answering (SIGSTOP): node 0's end of epoch gives up after ``push_wait_s``,
    logs it and counts the pushes left; the client's own timeout then marks the node down."""
    nodes = make_nodes(delay_s=0.0, push_wait_s=0.5, timeout_s=5.0)
    nodes.freeze(1)
    tier = nodes.tiers[0]
    for i in nodes.owners.owned(1)[:10].tolist():  # read from storage, on their way to the frozen node
        tier.offer(int(i), _item(int(i)))
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="coordl"):
        tier.end_epoch()
    took = time.monotonic() - t0
    assert 0.4 <= took < 3.0
    late = tier.stats()["remote_push_late"]
    assert late > 0
    assert "had not reached their owners" in caplog.text and "push_wait_s" in caplog.text
    t0 = time.monotonic()
    tier.end_epoch()  # the loader's second end of the same epoch (at StopIteration): no second wait
    assert time.monotonic() - t0 < 0.2 and tier.stats()["remote_push_late"] == late


@pytest.mark.redis
def test_a_dead_owner_ends_the_wait_at_once(make_nodes) -> None:
    """Node 1's Redis is gone: pushes to it fail at once, the node is skipped, the epoch ends."""
    nodes = make_nodes(delay_s=0.0, push_wait_s=30)
    nodes.servers[1].stop()
    tier = nodes.tiers[0]
    for i in nodes.owners.owned(1)[:10].tolist():
        tier.offer(int(i), _item(int(i)))
    t0 = time.monotonic()
    tier.end_epoch()
    assert time.monotonic() - t0 < 5.0  # a refused connection, not the 30 s bound
    st = tier.stats()
    assert st["remote_push_late"] == 0 and st["remote_errors"] == 1


class _Stuck:
    """A transport whose pushes never finish (a worker stuck sending, then killed)."""

    counters = None

    def fetch(self, wanted):  # noqa: ANN001
        return {}

    def put(self, node: int, index: int, raw) -> bool:  # noqa: ANN001
        return False

    def put_many(self, node: int, items) -> int:  # noqa: ANN001
        time.sleep(3600)
        return 0

    def is_down(self, node: int) -> bool:
        return False

    def close(self) -> None:
        pass


def _queue_then_hang(tier: PartitionedTier, ready) -> None:  # noqa: ANN001
    for i in range(5):
        tier.offer(i, b"x" * 10)  # owned by node 1: queued for it, never sent
    ready.set()
    time.sleep(3600)


def test_pushes_of_a_worker_that_died_are_not_waited_for() -> None:
    owners = OwnerMap(10, [0, 1])  # node 1 owns everything
    base = SharedCounters(["cache_hits", "cache_misses"])
    tier = PartitionedTier(owners, 0, _Stuck(), base, push_wait_s=30)
    ctx = multiprocessing.get_context("fork")
    workers = []
    try:
        for _ in range(2):
            ready = ctx.Event()
            workers.append(ctx.Process(target=_queue_then_hang, args=(tier, ready), daemon=True))
            workers[-1].start()
            assert ready.wait(30)
            if len(workers) == 1:
                t0 = time.monotonic()
                tier.end_epoch(timeout_s=0.3)  # alive and stuck: waited for, up to the bound
                assert time.monotonic() - t0 >= 0.3 and tier.stats()["remote_push_late"] == 5
        for w in workers:  # both die with 5 pushes each in flight
            w.kill()
            w.join(10)
        t0 = time.monotonic()
        tier.end_epoch()
        assert time.monotonic() - t0 < 1.0  # dead: their pushes will never end, not waited for
        assert tier.stats()["remote_push_late"] == 5
    finally:
        for w in workers:
            if w.is_alive():
                w.kill()
        tier.close()
        base.close()

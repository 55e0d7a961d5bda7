"""Remote prep on a real Ray cluster (head + prep nodes as separate ``ray start`` processes, token auth).

Promises (docs/remote_prep.md): the batches are those of the same loader with local workers only
(same items, same order, same per-item random draws), with local workers, without them, with raw bytes
shipped; ``state_dict()`` mid-epoch resumes to the same rest; a corrupt item raises the same
``CorruptItemError`` as locally; a prep node killed mid-epoch costs no batch and duplicates none; the
whole cluster lost mid-run leaves local prep and one warning; an unreachable address fails at once
naming it; bad options are refused naming them. One cluster for the module (Ray starts in seconds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("ray", reason="remote prep needs Ray: pip install 'coordl[ray]'")

import coordl  # noqa: E402
from coordl.datasets.synth import make_dataset  # noqa: E402
from coordl.errors import CorruptItemError  # noqa: E402
from tests.coordl.remote.ray_cluster import ROOT, RayCluster  # noqa: E402
from tests.support.netns import skip_reason as netns_skip_reason  # noqa: E402

N = 48
BATCH = 4


@pytest.fixture(scope="module")
def cluster():
    reason = netns_skip_reason()  # the cluster runs in a loopback-only network namespace (ray_cluster.py)
    if reason:
        pytest.skip(reason)
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    import ray

    c = RayCluster()
    try:
        c.start_head()
        coordl.RemotePrep(c.address, token=c.token).connect()  # this process is the cluster's driver
        c.add_node()
        yield c
    finally:
        ray.shutdown()
        c.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return Path(make_dataset(tmp_path_factory.mktemp("jpegs"), n=N, classes=3, width=96, height=72, seed=1))


def _dataset(root: Path, transform=None) -> coordl.ImageFolder:
    return coordl.ImageFolder(str(root), transform=transform or coordl.transforms.train_transform(32))


class _SlowRecipe:
    """The recipe at 30 ms an item: an actor still has batches in flight when its node is killed (its
    feeder thread takes finished batches as soon as they are done)."""

    def __init__(self) -> None:
        self.recipe = coordl.transforms.train_transform(32)

    def __call__(self, raw: bytes) -> torch.Tensor:
        time.sleep(0.03)
        return self.recipe(raw)


def _run(
    root: Path,
    remote=None,
    workers: int = 1,
    stop_after: int | None = None,
    on_batch=None,
    transform=None,
    **kw,
):
    """Every batch of one shuffled epoch (copies), and the loader's stats."""
    kw.setdefault("batch_size", BATCH)
    loader = coordl.DataLoader(
        _dataset(root, transform), shuffle=True, num_workers=workers,
        generator=torch.Generator().manual_seed(5), remote_prep=remote, **kw,
    )  # fmt: skip
    out = []
    try:
        for n, (x, y) in enumerate(loader):
            out.append((x.clone(), y.clone()))
            if on_batch is not None:
                on_batch(n)
            if stop_after is not None and n + 1 == stop_after:
                return out, loader.state_dict(), loader.stats()
        return out, None, loader.stats()
    finally:
        loader.close()


def _same(a, b) -> bool:
    return len(a) == len(b) and all(
        torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(a, b, strict=True)
    )


@pytest.fixture(scope="module")
def local(root):
    return _run(root, workers=1)[0]


@pytest.fixture(scope="module")
def local_pairs(root):
    """Batches of 2: the fault tests' epochs are long enough that batches are still to be drawn when
    the node dies (so the dead actor is noticed)."""
    return _run(root, workers=1, batch_size=2)[0]


def test_same_batches_as_local_workers(cluster, root, local):
    batches, _, stats = _run(root, coordl.RemotePrep(cluster.address, cpus=1), workers=1)
    assert _same(batches, local)
    assert 0 < stats["remote_batches"] <= len(local)
    assert stats["remote_items"] == BATCH * stats["remote_batches"]
    # local and remote items together are the epoch, none twice
    assert stats["items_loaded"] + stats["remote_items"] == N
    # the uint8 crops came back (ToTensor + Normalize ran in the trainer: coordl.remote.compact)
    assert stats["remote_bytes_received"] == stats["remote_batches"] * BATCH * 3 * 32 * 32
    assert stats["remote_storage_bytes_read"] > 0 and stats["remote_shipped_actors"] == 0


def _user_transform(raw: bytes) -> torch.Tensor:
    """A user's own transform (not a coordl Compose): its batches come back collated, as tensors."""
    return coordl.transforms.train_transform(32)(raw)


def test_a_user_transform_comes_back_collated(cluster, root, local):
    def run(remote):
        loader = coordl.DataLoader(
            coordl.ImageFolder(str(root), transform=_user_transform), batch_size=BATCH, shuffle=True,
            num_workers=0, generator=torch.Generator().manual_seed(5), remote_prep=remote,
        )  # fmt: skip
        try:
            return [(x.clone(), y.clone()) for x, y in loader], loader.stats()
        finally:
            loader.close()

    batches, stats = run(coordl.RemotePrep(cluster.address))
    assert _same(batches, local)
    assert stats["remote_batches"] == len(local)
    # float32 crops and int64 labels, collated on the actor
    assert stats["remote_bytes_received"] == stats["remote_batches"] * BATCH * (3 * 32 * 32 * 4 + 8)


def test_all_prep_remote_without_workers(cluster, root, local):
    batches, _, stats = _run(root, coordl.RemotePrep(cluster.address), workers=0)
    assert _same(batches, local)
    assert stats["remote_batches"] == len(local) and stats["items_loaded"] == 0


def test_shipped_raw_bytes(cluster, root, local):
    batches, _, stats = _run(root, coordl.RemotePrep(cluster.address, read="ship"), workers=0)
    assert _same(batches, local)
    assert stats["remote_shipped_actors"] == 1 and stats["remote_storage_bytes_read"] == 0
    sizes = sum(p.stat().st_size for p in root.rglob("*.jpg"))
    # every item's bytes went over once, read by the trainer (counted as its storage reads)
    assert stats["remote_bytes_sent"] == sizes + 16 * N
    assert stats["storage_bytes_read"] == sizes


def test_resume_mid_epoch(cluster, root, local):
    remote = coordl.RemotePrep(cluster.address)
    first, state, _ = _run(root, remote, workers=1, stop_after=5)
    loader = coordl.DataLoader(
        _dataset(root), batch_size=BATCH, shuffle=True, num_workers=1,
        generator=torch.Generator().manual_seed(5), remote_prep=remote,
    )  # fmt: skip
    loader.load_state_dict(state)
    rest = [(x.clone(), y.clone()) for x, y in loader]
    loader.close()
    assert _same(first + rest, local)


def test_corrupt_item_raises_the_local_error(cluster, tmp_path):
    root = Path(make_dataset(tmp_path / "bad", n=8, classes=2, width=64, height=48, seed=2))
    victim = sorted(root.rglob("*.jpg"))[3]
    victim.write_bytes(victim.read_bytes()[:200])

    def first_error(remote, workers):
        loader = coordl.DataLoader(_dataset(root), batch_size=2, num_workers=workers, remote_prep=remote)
        try:
            with pytest.raises(CorruptItemError) as caught:
                list(loader)
        finally:
            loader.close()
        return caught.value

    here = first_error(None, 0)
    there = first_error(coordl.RemotePrep(cluster.address), 0)
    assert str(there) == str(here) and there.path == str(victim) and there.index == 3


def test_bad_options(cluster, root):
    with pytest.raises(TypeError, match="remote_prep must be a coordl.RemotePrep"):
        coordl.DataLoader(_dataset(root), batch_size=2, remote_prep=cluster.address)
    with pytest.raises(ValueError, match='remote_prep needs on_error="raise"'):
        coordl.DataLoader(_dataset(root), batch_size=2, on_error="skip", remote_prep=coordl.RemotePrep("h:1"))
    with pytest.raises(coordl.RemotePrepError, match="already connected to the Ray cluster at"):
        coordl.DataLoader(_dataset(root), batch_size=2, remote_prep=coordl.RemotePrep("127.0.0.1:9"))
    for kwargs, match in [
        ({"address": "no-port"}, "address must be"),
        ({"address": "h:1", "cpus": 0}, "cpus must be"),
        ({"address": "h:1", "read": "nfs"}, "read must be one of"),
    ]:
        with pytest.raises(ValueError, match=match):
            coordl.RemotePrep(**kwargs)


def test_unreachable_cluster_fails_at_once_naming_it():
    # a fresh process: this one is already the test cluster's driver (Ray allows one per process)
    message, seconds = _connect_in_new_process("127.0.0.1:9", None)
    assert "127.0.0.1:9" in message and "cannot reach the Ray cluster" in message
    assert seconds < 10


def _connect_in_new_process(address: str, token: str | None) -> list:
    """``[message, seconds]`` of the RemotePrepError a fresh process gets from ``address``."""
    code = (
        "import json, sys, time, coordl\n"
        "import ray, torch  # imported before the clock starts: their import is seconds of CPU on a loaded host\n"
        "t = time.monotonic()\n"
        "try:\n"
        "    coordl.DataLoader(list(range(4)), batch_size=2,\n"
        "                      remote_prep=coordl.RemotePrep(sys.argv[1], token=sys.argv[2] or None))\n"
        "except coordl.RemotePrepError as e:\n"
        "    print(json.dumps([str(e), time.monotonic() - t]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["PYTHONPATH"] = str(ROOT)
    args = [sys.executable, "-c", code, address, token or ""]
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=180)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_wrong_token_is_refused_naming_the_cluster(cluster):
    message, _ = _connect_in_new_process(cluster.address, "not-the-token-of-this-cluster")
    assert cluster.address in message and "token" in message


@pytest.mark.slow
def test_node_killed_mid_epoch_loses_and_repeats_nothing(cluster, root, local_pairs):
    node = cluster.add_node(cores="0")
    try:
        batches, _, stats = _run(
            root, coordl.RemotePrep(cluster.address, cpus=2), workers=1, batch_size=2,
            on_batch=lambda n: node.kill() if n == 0 else None, transform=_SlowRecipe(),
        )  # fmt: skip
    finally:
        node.kill()
    assert _same(batches, local_pairs)
    assert stats["remote_actors"] == 1  # the killed node's actor was dropped, the other went on
    assert stats["items_loaded"] + stats["remote_items"] + stats["remote_redone_items"] == N


@pytest.mark.slow
def test_cluster_lost_mid_run_goes_on_locally_with_one_warning(cluster, root, local_pairs):
    node = cluster.add_node(resources='{"lost_test": 1}', cores="0")
    remote = coordl.RemotePrep(cluster.address, cpus=1, resources={"lost_test": 1})
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            started = time.monotonic()
            batches, _, stats = _run(
                root, remote, workers=1, batch_size=2, on_batch=lambda n: node.kill() if n == 0 else None
            )
    finally:
        node.kill()
    lost = [w for w in caught if "no actor left" in str(w.message)]
    assert len(lost) == 1 and cluster.address in str(lost[0].message)
    assert _same(batches, local_pairs)
    assert stats["remote_actors"] == 0
    assert time.monotonic() - started < 120

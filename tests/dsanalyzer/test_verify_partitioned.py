"""``whatif --nodes 2`` and ``3`` verified for real: profile a fetch-bound job on one node, predict the
partitioned cache over N nodes, run N nodes with ``partitioned=True`` in network namespaces joined by
rate-limited links.

The job (:mod:`tests.dsanalyzer.partitioned_job`) reads 800 files of 50 kB through an emulated 4 MB/s
device per node, light prep, a 5 ms step, two persistent workers. Profiled alone with a 22 MB MinIO
cache it reads 45 % of its items from storage. On N nodes each caching 22 MB they hold the whole dataset: 1/N of a node's reads come
from its own cache, the rest from the other nodes' Redis over a 24 Mbit/s link (tc tbf on both ends of
each node's veth), none from storage; so the prediction rests on the remote hit's cost (its bytes at the
link's useful rate, plus the client's copies the profile probed). The measured rate per node (the slower
node's median epoch from the third on: the first fills the caches, the second makes sure every push
arrived; the median of two runs) must be within 10 % of it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from dsanalyzer.cli import main as cli_main
from tests.support.netns import VirtualNetwork, skip_reason

pytestmark = [pytest.mark.netns, pytest.mark.redis]

JOB = Path(__file__).with_name("partitioned_job.py")
ITEMS, ITEM_BYTES = 800, 50_000
CACHE_BYTES = 22_000_000  # per node: half the dataset plus 10 %
LINK_MBIT = 24.0
NODES = (2, 3)
EPOCHS, WARM_EPOCHS = 8, 2


def write_data(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(ITEMS):
        (root / f"{i:05d}.bin").write_bytes(os.urandom(ITEM_BYTES))
    return root


def job_args(data: Path, devices: Path) -> list[str]:
    return [sys.executable, str(JOB), "--data", str(data), "--device-dir", str(devices), "--storage-mbps", "4",
            "--cache-bytes", str(CACHE_BYTES), "--workers", "2", "--batch", "16", "--step-ms", "5",
            "--persistent-workers"]  # fmt: skip


def run_nodes(args: list[str], nodes: int) -> list[dict]:
    """The job on ``nodes`` namespaces with ``partitioned=True``: each node's per-epoch JSON records."""
    with VirtualNetwork(nodes, rate_mbit=LINK_MBIT, prefix="dsavp") as net:
        port = net.hosts[0].free_port()
        procs = [
            net.hosts[r].popen(
                [*args, "--partitioned", "--epochs", str(EPOCHS)],
                env={**net.dist_env(r, nodes, port), "OMP_NUM_THREADS": "1"},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for r in range(nodes)
        ]
        outs = [p.communicate(timeout=240) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    return [json.loads(line) for out, _ in outs for line in out.splitlines() if line.startswith("{")]


def per_node_rate(records: list[dict]) -> float:
    """Samples/s of the slower node in its median epoch after the warm ones (each epoch's start included).

    The median, not the mean: on this shared 2-core VM one epoch in four or five ran 20 % long while
    other sessions' processes held the cores (the prediction is for the job on its own cores).
    """
    rates = []
    for node in {r["node"] for r in records}:
        mine = [r for r in records if r["node"] == node and r["epoch"] >= WARM_EPOCHS]
        rates.append(statistics.median(r["n"] / r["secs"] for r in mine))
    return min(rates)


@pytest.mark.skipif(
    os.environ.get("COORDL_VERIFY_REMEDIES") != "1",
    reason="a remedy applied for real, minutes alone on the machine: make verify-remedies (CI's 20 minutes)",
)
@pytest.mark.slow
@pytest.mark.exclusive  # measures against a target: runs alone (scripts/test.sh)
@pytest.mark.timeout(900)
def test_partitioned_cache_over_two_and_three_nodes_runs_at_the_predicted_rate(tmp_path, capsys):
    if reason := skip_reason():
        pytest.skip(reason)
    data, devices, out = write_data(tmp_path / "data"), tmp_path / "devices", tmp_path / "profile"
    devices.mkdir()
    args = job_args(data, devices)
    profile = [
        "profile",
        "--quiet",
        "--iters",
        "30",
        "--warmup",
        "3",
        "--min-seconds",
        "3",
        "--out",
        str(out),
    ]
    assert cli_main([*profile, "--", *args]) == 0
    capsys.readouterr()
    report = json.loads((out / "report.json").read_text())
    assert report["cache_policy"] == "minio" and "error" not in report["peer"], report.get("peer")
    assert report["verdict"]["bound"] == "fetch"  # alone, the job waits for storage
    for nodes in NODES:
        whatif = [
            "whatif",
            str(out / "report.json"),
            "--nodes",
            str(nodes),
            "--peer-gbps",
            str(LINK_MBIT / 1e3),
        ]
        assert cli_main(whatif) == 0
        printed = capsys.readouterr().out
        predicted = float(printed.strip().splitlines()[-1].split("=")[1])
        assert "per node" in printed and "aggregate" in printed

        runs = [run_nodes(args, nodes) for _ in range(2)]
        for records in runs:  # the setting the prediction assumes: no storage read once the caches are full
            warm = [r for r in records if r["epoch"] == WARM_EPOCHS - 1]
            last = [r for r in records if r["epoch"] == EPOCHS - 1]
            misses = {r["node"]: r["cache_misses"] for r in warm}
            assert all(r["cache_misses"] == misses[r["node"]] and r["remote_errors"] == 0 for r in last), last
        measured = statistics.median(per_node_rate(r) for r in runs)
        with capsys.disabled():
            print(f"\nnodes={nodes} predicted {predicted:.1f} measured {measured:.1f} per node "
                  f"({measured / predicted - 1:+.1%}); runs {[round(per_node_rate(r), 1) for r in runs]}")  # fmt: skip
        assert measured == pytest.approx(predicted, rel=0.10), nodes

"""``whatif --remote-cpus`` against a real run on a Ray cluster, judged by ``dsanalyzer verify``.

A prep-bound job (the standard recipe at 224 px, one local worker, no model: tests/dsanalyzer/remote_job.py)
is profiled on core 0 alone; the what-if predicts it with one remote CPU; then the same job runs with
``remote_prep=`` against a cluster whose one prep node is pinned to core 1 (tests/coordl/remote/ray_cluster.py,
in a loopback-only network namespace), under ``dsanalyzer verify``: the judge applies the run's remote
CPUs (its loader's facts) and sets the measured rate beside the prediction.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.netns import skip_reason as netns_skip_reason

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "dsanalyzer" / "remote_job.py"
DSANALYZER = [sys.executable, "-m", "dsanalyzer.cli"]


def _run(args: list[str], timeout: float = 900) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    return out.stdout


@pytest.mark.skipif(
    os.environ.get("COORDL_VERIFY_REMEDIES") != "1",
    reason="a remedy applied for real, minutes alone on the machine: make verify-remedies (CI's 20 minutes)",
)
@pytest.mark.slow
@pytest.mark.exclusive  # measures against a target: runs alone (scripts/test.sh)
def test_remote_cpu_what_if_is_verified_on_a_cluster(tmp_path):
    if (os.cpu_count() or 1) < 2 or netns_skip_reason():
        pytest.skip(netns_skip_reason() or "needs two cores")
    pytest.importorskip("ray")
    import coordl
    from coordl.datasets.synth import make_dataset
    from tests.coordl.remote.ray_cluster import RayCluster

    root = make_dataset(tmp_path / "jpegs", n=1000, classes=10)
    core0 = ["taskset", "-c", "0"]
    out = tmp_path / "profile"
    _run([*core0, *DSANALYZER, "profile", "--iters", "40", "--min-seconds", "3", "--quiet", "--out", str(out),
          "--", sys.executable, str(JOB), root])  # fmt: skip
    report = json.loads((out / "report.json").read_text())
    assert report["loader"]["remote_cpus"] == 0 and report["loader"]["remote_wire_bytes"] == 224 * 224 * 3
    predicted = float(
        _run([*DSANALYZER, "whatif", str(out / "report.json"), "--remote-cpus", "1"]).split("=")[-1]
    )

    cluster = RayCluster()
    try:
        cluster.start_head()
        coordl.RemotePrep(cluster.address, token=cluster.token).connect()
        cluster.add_node(cores="1")
        job = [sys.executable, str(JOB), root, "--remote", cluster.address, "--token", cluster.token]
        # the new node's first seconds (Ray starting its worker processes on the prep core) are not the
        # remedy: one short run first (measured: a first run 18-25% below the second, then not)
        _run([*core0, *job, "--epochs", "3"])
        # --baseline: the profiled job beside each run (the same job measured 1,035 and 1,127 samples/s
        # half an hour apart on the 2-core VM: the prediction is judged on the machine of these minutes)
        _run([*core0, *DSANALYZER, "verify", "--runs", "3", "--baseline", "--iters", "60", "--min-seconds", "6",
              "--quiet", str(out), "--", *job])  # fmt: skip
    finally:
        import ray

        ray.shutdown()
        cluster.stop()
    v = json.loads((out / "report.json").read_text())["verify"]
    assert v["change"] == {"remote_cpus": 1}
    assert v["predicted_samples_per_s"] == pytest.approx(predicted, rel=1e-5)  # whatif prints 6 digits
    base = v["baseline"]
    print(f"remote what-if: predicted {predicted:.1f}, measured {v['measured_samples_per_s']:.1f} "
          f"({v['error']:+.1%}; runs {[round(r['samples_per_s']) for r in v['runs']]}); the profiled job "
          f"{base['drift'] - 1:+.1%} since its profile ({[round(r) for r in base['runs_samples_per_s']]}), "
          f"error on that machine {base['error']:+.1%}")  # fmt: skip
    split = v["remote_split"]  # the loader's remote_items over the measured batches
    print(f"  remote {split['measured_remote_samples_per_s']:.0f} (predicted {split['predicted_remote_samples_per_s']:.0f}), "
          f"local {split['measured_local_samples_per_s']:.0f} (predicted {split['predicted_local_samples_per_s']:.0f})")  # fmt: skip
    assert 0.2 < split["remote_share"] < 0.9, split
    # the remote core adds (the profile's own real run is the local-only rate)
    assert v["measured_samples_per_s"] >= 1.2 * report["rates_per_s"]["observed"], v
    # issue 49 asks 10%, judged on the machine of these minutes (verify --baseline). Measured on the Intel
    # VM (2026-11-28): -3.3%, -9.8%, -3.1%, -3.3% (against the profile's minutes: -8.4%, -11.3%, -6.5%,
    # -8.1%; the profiled job itself ran 1.6-5.3% slower beside them than in its profile). The raw error
    # keeps a looser bound: a machine that moved more than that is not what this test checks.
    assert abs(v["baseline"]["error"]) <= 0.10, v
    assert abs(v["error"]) <= 0.20, v

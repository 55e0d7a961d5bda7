"""A finished merged epoch is freed at once, with its torch iterator and the pipes of its queues.

Found by the soak (benchmarks/soak, the ``ray`` job): torch's iterator held the epoch's ``_LocalShare``,
which held the epoch, which held torch's iterator; the cycle kept every finished epoch's iterator and its
queues' pipes open until a full garbage collection, 4 descriptors more per epoch (1,228 in a 4-minute
soak). The check runs with the garbage collector off, in a process of its own with a local Ray instance
(``ray.init``; Ray allows one cluster per process and the other tests' process is a driver already).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="remote prep needs Ray: pip install 'coordl[ray]'")

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = r"""
import gc, json, os, shutil, sys, tempfile
import torch, ray, coordl

class Items:
    def __len__(self):
        return 96
    def fetch(self, i):
        return int(i).to_bytes(4, "little") * 8
    def prep(self, raw, i):
        return torch.tensor([int.from_bytes(raw[:4], "little")])

gc.disable()  # what only a full collection would free stays: the cycle shows
temp = tempfile.mkdtemp(prefix="coordl_ray_", dir="/tmp")  # short: Ray's socket paths live under it
ray.init(num_cpus=1, include_dashboard=False, object_store_memory=80 << 20, log_to_driver=False, _temp_dir=temp)
loader = coordl.DataLoader(Items(), batch_size=4, shuffle=True, num_workers=1,
                           generator=torch.Generator().manual_seed(1),
                           remote_prep=coordl.RemotePrep("auto", cpus=1, start_timeout=120))
fds, seen = [], []
for epoch in range(6):
    seen += [int(x) for b in loader for x in b.flatten()]
    fds.append(len(os.listdir("/proc/self/fd")))
remote = loader.stats()["remote_batches"]
loader.close()
ray.shutdown()
shutil.rmtree(temp, ignore_errors=True)
print(json.dumps({"fds": fds, "remote_batches": remote, "items": sorted(seen)}))
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_finished_epochs_leave_no_open_pipes() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=280)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["remote_batches"] > 0  # the actor prepped batches: the merged epochs ran
    assert out["items"] == sorted(list(range(96)) * 6)
    # each epoch's torch iterator opened pipes (4 descriptors); with the cycle they stayed, one set per epoch
    assert out["fds"][-1] - out["fds"][0] <= 2, out["fds"]

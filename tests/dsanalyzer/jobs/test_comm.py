"""Communication stalls: the timing interface, the timed DDP hook, and a 2-rank torchrun profile."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest
import torch

from dsanalyzer.cli import main as cli_main
from dsanalyzer.jobs import comm
from dsanalyzer.model.comm import CommModel

TORCHRUN = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")


class FakeBucket:
    def __init__(self, nbytes: int, last: bool) -> None:
        self._buf = torch.zeros(nbytes // 4)
        self._last = last

    def buffer(self) -> torch.Tensor:
        return self._buf

    def is_last(self) -> bool:
        return self._last


def sleeping_hook(delay_s: float):
    def hook(state, bucket):
        time.sleep(delay_s)
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    return hook


def test_record_collective_is_a_no_op_without_a_recorder():
    comm.set_recorder(None)
    comm.record_collective("allreduce", 100, 0.5)  # nothing to receive it: must not fail


def test_wrapped_hook_reports_bytes_time_and_the_exposed_part():
    log = comm.CommLog()
    comm.set_recorder(log)
    try:
        hook = comm.wrap_hook(sleeping_hook(0.02))
        log.iteration = 0
        hook(None, FakeBucket(4000, last=False)).wait()  # completes before the last bucket: hidden
        hook(None, FakeBucket(8000, last=True)).wait()
        log.iteration = 1
        hook(None, FakeBucket(8000, last=True)).wait()
    finally:
        comm.set_recorder(None)
    series = log.series(2)
    assert series["bytes"] == [12000.0, 8000.0]
    assert [len(c) for c in series["collectives"]] == [2, 2, 2]
    # the first bucket finished before the last one was launched: only the last one's time is exposed
    assert series["exposed_s"][0] == pytest.approx(series["collectives"][1][1], rel=1e-6)
    assert series["comm_s"][0] == pytest.approx(series["collectives"][0][1] + series["collectives"][1][1])


def test_comm_model_link_speed_and_compression():
    m = CommModel(world_size=2, comm_total_s=0.05, comm_exposed_s=0.03, bytes_per_iter=1e8,
                  collectives_per_iter=1, latency_s=0.0, bytes_per_s=2e9)  # fmt: skip
    assert m.exposed_s() == pytest.approx(0.03)  # as measured: 0.05 total, 0.02 hidden
    # 10 Gbit/s ring all-reduce of 100 MB on 2 ranks: 2*(1/2)*1e8 B / 1.25e9 B/s = 0.08 s, 0.02 s hidden
    assert m.exposed_s(link_gbps=10) == pytest.approx(0.06)
    assert m.exposed_s(compress_ratio=10) == pytest.approx(0.0)
    assert m.compute_speedup(0.1, compress_ratio=10) == pytest.approx(0.1 / 0.07)


DDP_SCRIPT = r"""
import os, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from dsanalyzer.jobs.comm import wrap_hook

DELAY_S = float(os.environ["TEST_COMM_DELAY_S"])
dist.init_process_group("gloo")
torch.manual_seed(0)
torch.set_num_threads(1)
model = DDP(torch.nn.Linear(16, 4))

def slow_allreduce(state, bucket):  # the injected communication delay, inside the comm hook
    time.sleep(DELAY_S)
    return allreduce_hook(state, bucket)

model.register_comm_hook(None, wrap_hook(slow_allreduce))
data = TensorDataset(torch.randn(256, 16), torch.randn(256, 4))
loader = DataLoader(data, batch_size=8, shuffle=True)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(100):
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
"""


@pytest.mark.slow
@pytest.mark.exclusive  # measures against a target: runs alone (scripts/test.sh)
def test_torchrun_profile_measures_an_injected_communication_delay(tmp_path, monkeypatch, capsys):
    delay_s = 0.08
    script = tmp_path / "train_ddp.py"
    script.write_text(DDP_SCRIPT)
    monkeypatch.setenv("TEST_COMM_DELAY_S", str(delay_s))
    out = tmp_path / "run"
    data = tmp_path / "data"  # the tensors' bytes on disk, so that the what-if model has an item size
    data.mkdir()
    for i in range(256):
        (data / f"{i}.bin").write_bytes(bytes(80))
    command = [TORCHRUN, "--standalone", "--nproc-per-node", "2", str(script)]
    args = ["--quiet", "--iters", "12", "--warmup", "3", "--data", str(data), "--out", str(out)]
    rc = cli_main(["profile", *args, "--", *command])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    report = json.loads((out / "report.json").read_text())
    rows = report["comm"]["per_rank"]
    assert [r["rank"] for r in rows] == [0, 1] and report["comm"]["world_size"] == 2
    # The sleep sits in the hook of the step's only (so last) bucket: all of it is exposed, plus a
    # gloo all-reduce of 80 bytes on loopback (well under a millisecond): within 10% of the delay.
    for row in rows:
        assert abs(row["comm_stall_s"] - delay_s) <= 0.1 * delay_s, row
    assert report["comm"]["slowest_rank"] in (0, 1)
    assert "communication stall" in printed and "rank 1" in printed
    rc = cli_main(["whatif", str(out / "report.json"), "--compress-ratio", "4", "--link-gbps", "1"])
    assert rc == 0 and "communication:" in capsys.readouterr().out

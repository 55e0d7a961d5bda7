"""Plain jobs as users write them, profiled end to end by ``dsanalyzer profile``, against known truths.

* The README's profiling example (its script is read out of README.md, so the two cannot drift).
* A job built to be prep-bound (each item burns CPU in ``__getitem__``, the step is a tiny linear
  layer), restricted to 1 and to 2 CPUs with ``taskset``: the stalls and the verdict must both name
  prep, and the what-if must say more cores help. Its dataset is generated in memory, so the report
  must also carry a what-if with fetch modelled as free; ``--trace`` writes its timeline.
* A Lightning job, one process and ``strategy="ddp"`` with two: a dataset of tensors in memory gets
  a what-if, and the per-epoch figures count each rank's own batches (64 of 128).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.dsanalyzer.report.test_trace import check_trace_format

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# Only the job pinned to 1 and 2 cores is ``exclusive`` (its rates on pinned cores: run alone, scripts/test.sh);
# the others assert what the report holds and how its bounds agree, not a rate, and run in CI's parallel phase.
pytestmark = pytest.mark.slow

PREP_BOUND = r"""
import sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class Burn(Dataset):
    # 6 ms of CPU per item, generated in memory: a job whose data prep is the known bottleneck
    def __len__(self):
        return 512

    def __getitem__(self, i):
        end = time.thread_time() + 0.006  # (argv[2], when given: torch.set_num_threads)
        while time.thread_time() < end:
            pass
        return torch.full((16,), float(i)), i % 4

if len(sys.argv) > 2:
    torch.set_num_threads(int(sys.argv[2]))
loader = DataLoader(Burn(), batch_size=8, shuffle=True, num_workers=int(sys.argv[1]))
model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(5):
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
"""


def _profile(
    tmp_path: Path,
    script: Path,
    args: list[str],
    cpus: str | None = None,
    iters: int = 10,
    trace: bool = False,
) -> dict:
    out = tmp_path / f"out-{script.stem}-{cpus or 'all'}"
    cmd = [str(BIN / "dsanalyzer"), "profile", "--quiet", "--iters", str(iters), "--warmup", "2",
           *(["--trace"] if trace else []), "--out", str(out), "--", sys.executable, str(script), *args]  # fmt: skip
    if cpus is not None:
        cmd = [shutil.which("taskset") or "taskset", "-c", cpus, *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads((out / "report.json").read_text())


def _one_bound(report: dict) -> None:
    """The report's bounds agree, or the sentence explains the difference with numbers."""
    v = report["verdict"]
    assert v["measured_bound"] == report["bound"]
    if v["bound"] != report["bound"]:
        assert v["bound_note"] and "the stalls as measured name" in report["advice"]
    if v["more_cores"]["rises"]:
        assert "will not help" not in report["advice"]


def readme_script() -> str:
    """The training script of README.md's dsanalyzer section, as a user would copy it."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## dsanalyzer") :]
    match = re.search(r"cat > /tmp/train.py <<'EOF'\n(.*?)\nEOF\n", section, re.S)
    assert match, "README.md's dsanalyzer section no longer writes /tmp/train.py"
    return match.group(1)


def test_readme_profiling_example_gets_a_report_with_one_bound(tmp_path):
    data = tmp_path / "synth"
    subprocess.run([str(BIN / "coordl"), "synth", str(data), "--n", "160", "--classes", "4", "--size", "96x72"],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    script = tmp_path / "train.py"
    script.write_text(readme_script())
    report = _profile(tmp_path, script, [str(data)])
    assert report["workers"] == 2 and report["dataset"]["items"] == 160
    _one_bound(report)
    assert report["whatif"]["grid"], report["model"]
    mp = report["main_process"]
    assert mp["receive_cpu_s_per_batch"] > 0 and mp["step_cpu_s_per_batch"] > 0
    assert all(c > 0 for c in report["prep_scaling"]["cpu_s_per_sample"])
    # the real run's CPU per sample, workers and main process together; torch's threads as the script left them
    assert mp["job_cpu_s_per_sample"] > 0 and mp["job_cpu_run"] == "real"
    # the cores the host left idle over the measured batches: at most the cores this job may use
    assert 0 <= mp["job_idle_cores"] <= len(os.sched_getaffinity(0)) + 0.05
    assert mp["threads_follow_cores"] and mp["threads_fixed_by"] is None and mp["step_device"] == "cpu"


@pytest.mark.exclusive  # rates on pinned cores: run alone (scripts/test.sh)
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to restrict the job to 1 and 2")
@pytest.mark.parametrize("cpus", ["0", "0,1"])
def test_job_built_prep_bound_is_named_prep_on_1_and_2_cpus(tmp_path, cpus):
    script = tmp_path / "burn.py"
    script.write_text(PREP_BOUND)
    threads = ["1"] if cpus == "0" else []  # on 1 CPU: the count the default has, but fixed by the script
    report = _profile(tmp_path, script, ["1", *threads], cpus=cpus, trace=True)
    assert report["machine"]["cpus"] == len(cpus.split(","))
    trace = json.loads((tmp_path / f"out-burn-{cpus}" / "trace.json").read_text())
    check_trace_format(trace)
    loop = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["name"] == "wait for data"]
    assert len(loop) == len(report["runs"]["real"]["wait_s"])
    assert {e["tid"] for e in trace["traceEvents"] if e["ph"] == "i"} == {10}  # its one loader worker
    assert report["bound"] == "prep", report["advice"]
    assert report["verdict"]["bound"] == "prep" and report["verdict"]["model_bound"] == "prep", report[
        "advice"
    ]
    _one_bound(report)
    assert report["verdict"]["more_cores"]["rises"]
    mp = report["main_process"]
    assert mp["torch_threads"] == len(cpus.split(",")) and mp["threads_follow_cores"] == (not threads)
    # generated in memory: the what-if is there, with fetch as free, and the report says so
    assert report["dataset"]["reads_no_files"] and "fetch as free" in report["dataset"]["size_method"]
    assert report["model"]["fetch_free"] and report["whatif"]["grid"]


LIGHTNING = r"""
import sys
import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

class Module(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(32, 4)

    def train_dataloader(self):
        data = TensorDataset(torch.randn(1024, 32), torch.randint(0, 4, (1024,)))
        return DataLoader(data, batch_size=8, shuffle=True, num_workers=1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

devices = int(sys.argv[1])
trainer = L.Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
                    max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, num_sanity_val_steps=0)
trainer.fit(Module())
"""


@pytest.mark.parametrize("devices", [1, 2])
def test_lightning_job_in_memory_gets_a_whatif_and_per_rank_epochs(tmp_path, devices):
    pytest.importorskip("lightning")
    script = tmp_path / "lit.py"
    script.write_text(LIGHTNING)
    report = _profile(tmp_path, script, [str(devices)], iters=8)
    assert report["dataset"]["reads_no_files"] and report["whatif"]["grid"], report["model"]
    assert report["per_epoch_s"]["iters"] == 128 // devices  # 1024 items, batch 8, this rank's share
    _one_bound(report)

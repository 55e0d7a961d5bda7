"""``dsanalyzer fix --online``: one run of an unmodified torch script whose loader tunes itself
(tests/dsanalyzer/fix_job.py: prep and step are sleeps, the same on a loaded host), and the hook's side of it
(:class:`dsanalyzer.measure.online.OnlineTune`) on stand-ins for the tuner's states."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from coordl.tune import Knobs
from dsanalyzer.measure.online import OnlineTune

ROOT = Path(__file__).resolve().parents[2]
JOB = ["tests/dsanalyzer/fix_job.py", "--items", "320"]


def _fix_online(*args: str, job: list[str], code: int = 0) -> tuple[str, dict | None]:
    cmd = [
        sys.executable,
        "-m",
        "dsanalyzer.cli",
        "fix",
        "--online",
        "--quiet",
        *args,
        "--",
        sys.executable,
        *JOB,
        *job,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == code, proc.stdout + proc.stderr
    if code:
        return proc.stderr, None
    path = proc.stdout.strip().splitlines()[-1].removeprefix("fix: ")
    return proc.stdout, json.loads(Path(path).read_text())


@pytest.mark.slow
def test_too_few_workers_are_fixed_in_one_run_and_patched(tmp_path):
    text, result = _fix_online("--out", str(tmp_path / "fix"), job=["--workers", "1"])
    assert result is not None and result["online"] and result["settled"]
    kept = result["kept"]["loader_args"]
    assert kept["num_workers"] >= 2 and result["kept"]["switch_to"] == ""  # the patch keeps torch's loader
    # 2+ workers of sleeping prep against 1 (the step takes 10 ms of a batch's 64): generous for a loaded host
    assert result["speedup"] > 1.3, text
    assert result["rounds"][0]["status"] == "kept" and "num_workers=" in result["rounds"][0]["change"]
    assert (
        f"+    loader = DataLoader(data, batch_size=a.batch, shuffle=True, num_workers={kept['num_workers']})"
        in text
    )
    assert "your configuration" in text and f"final: {result['speedup']:.2f}x your configuration" in text
    # one run of the script: no profile, nothing else run
    assert sorted(p.name for p in (tmp_path / "fix" / "logs").iterdir()) == ["online", "online.log"]


@pytest.mark.slow
def test_a_compute_bound_job_is_left_as_it_is(tmp_path):
    # a 120 ms step against 0.8 ms of prep a batch: no knob of the loader's is predicted to gain
    text, result = _fix_online("--out", str(tmp_path / "fix"), job=["--workers", "2", "--prep-ms", "0.1",
                                                                    "--step-ms", "120"])  # fmt: skip
    assert result is not None
    assert all(r["status"] != "kept" for r in result["rounds"]) and "patch" not in result, text
    assert result["speedup"] == 1.0 and "keep the script as it is" in text


LIGHTNING = r"""
import time
import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

class Sleepy(Dataset):  # 8 ms of prep an item, a sleep: more workers help on any host
    def __len__(self):
        return 320

    def __getitem__(self, i):
        time.sleep(0.008)
        return torch.full((32,), float(i)), i % 4

class Module(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(32, 4)

    def train_dataloader(self):
        return DataLoader(Sleepy(), batch_size=8, shuffle=True, num_workers=1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=30, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
trainer.fit(Module())
"""


@pytest.mark.slow
def test_a_lightning_job_is_tuned_and_stopped_by_the_hook(tmp_path):
    """Lightning stops each epoch at len() (no StopIteration) and builds the loader in its own hook method:
    the tuner's epochs are judged all the same, the run stops long before max_epochs, and the patch names
    the line in train_dataloader()."""
    pytest.importorskip("lightning")
    script = tmp_path / "lit.py"
    script.write_text(LIGHTNING)
    cmd = [sys.executable, "-m", "dsanalyzer.cli", "fix", "--online", "--quiet", "--out", str(tmp_path / "fix"),
           "--", sys.executable, str(script)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "fix" / "fix.json").read_text())
    assert result["settled"] and 2 <= result["epochs"] < 8, result
    assert result["kept"]["loader_args"]["num_workers"] >= 2 and result["speedup"] > 1.3, proc.stdout
    workers = result["kept"]["loader_args"]["num_workers"]
    assert (
        f"+        return DataLoader(Sleepy(), batch_size=8, shuffle=True, num_workers={workers})"
        in proc.stdout
    )
    assert (
        "the loader's tuning is done, stopping the script"
        in (tmp_path / "fix" / "logs" / "online.log").read_text()
    )


def test_dry_run_is_refused_with_the_reason():
    text, _ = _fix_online("--dry-run", job=[], code=2)
    assert "--online runs the job to find its plan" in text


# -- the hook's side, on stand-ins for the tuner's states ---------------------------------------------------


class _Tuner:
    def __init__(self, **state) -> None:
        self.epoch, self.best, self.trial, self.pending, self.window, self.clock = (
            1,
            (Knobs(1, 2, 2), 100.0),
            None,
            None,
            None,
            None,
        )
        self.log: list = []
        self.__dict__.update(state)
        self.ended = 0

    def epoch_ended(self) -> None:
        self.ended += 1
        self.clock, self.epoch = None, self.epoch + 1

    def knobs(self) -> Knobs:
        return Knobs(1, 2, 2)


def _online(tuner: _Tuner, most: int = 8) -> OnlineTune:
    online = OnlineTune(most)
    online.tuner = tuner
    return online


def test_the_run_goes_on_while_a_change_is_tried_or_pending():
    assert not _online(_Tuner(trial={"knob": "num_workers=2"})).done()
    assert not _online(_Tuner(pending="k2")).done()
    assert not _online(_Tuner(window="short")).done()  # an epoch too short to judge: the next is added
    assert _online(_Tuner()).done()  # judged, and nothing else chosen
    assert _online(_Tuner(trial={"knob": "x"}, epoch=8), most=8).done()  # the most epochs asked for


def test_an_epoch_left_at_its_length_is_judged_before_asking():
    """Lightning and Accelerate stop at len(loader), never asking for StopIteration: the tuner has not
    judged that epoch when the next starts; the hook has it judged first (as its next iter() would)."""
    tuner = _Tuner(clock="open", trial={"knob": "x"})
    real_end = tuner.epoch_ended

    def judged() -> None:
        real_end()
        tuner.trial = None  # the trial judged at the epoch's end, nothing chosen after it

    tuner.epoch_ended = judged  # type: ignore[method-assign]
    assert _online(tuner).done() and tuner.ended == 1


def test_a_loader_that_cannot_tune_itself_is_named():
    online = OnlineTune(8)
    online.start(object())
    assert online.done() and "only coordl.DataLoader tunes itself" in online.facts()["error"]
    assert "builtins.object" in online.facts()["error"]


def test_the_last_epoch_is_judged_when_the_script_ends_after_it():
    tuner = _Tuner(clock="closed at len()", epoch=3)
    tuner.log = [{"before_items_per_s": 90.0, "knob": "num_workers=2", "kept": True}]
    facts = _online(tuner).facts()
    assert tuner.ended == 1 and facts["epochs"] == 4 and facts["first_items_per_s"] == 90.0

"""A plain torch job: dsanalyzer works without coordl importable, and sizes items from the files opened."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A plain torch Dataset over image files with PIL decode, as a user writes it: nothing lists its files
# under an attribute dsanalyzer knows (`self.names` is private to it).
SCRIPT = r"""
import json, os, sys
sys.modules["coordl"] = None  # `import coordl` now raises ImportError: dsanalyzer must not need it
import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

import dsanalyzer

class Pics(Dataset):
    def __init__(self, root):
        self.root = root
        self.names = sorted(os.listdir(root))

    def __len__(self):
        return len(self.names)

    def __getitem__(self, i):
        with Image.open(os.path.join(self.root, self.names[i])) as im:
            return torch.from_numpy(np.asarray(im.convert("RGB"), dtype=np.uint8).copy())

root, out = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(0)
os.makedirs(root, exist_ok=True)
for i in range(40):
    Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(os.path.join(root, f"{i}.png"))
report = dsanalyzer.profile(
    lambda: DataLoader(Pics(root), batch_size=4, num_workers=0, shuffle=True),
    lambda batch: None, iters=6, warmup=1, out=out, workers_list=[1],
)
sizes = [os.path.getsize(os.path.join(root, n)) for n in os.listdir(root)]
print(json.dumps({"avg": report["dataset"]["avg_item_bytes"], "true_avg": sum(sizes) / len(sizes),
                  "coordl_loaded": any(k.startswith("coordl.") for k in sys.modules),
                  "grid": len(report["whatif"]["grid"]), "model": report["model"],
                  "spread": report.get("prep_spread")}))
"""


@pytest.mark.slow
def test_plain_torch_job_without_coordl_gets_item_sizes_and_a_model(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "pics"), str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not got["coordl_loaded"]
    # every file is opened once per item: the traced mean is a mean over 24 of the 40 files, within
    # the spread of PNG sizes of random pixels (all the same shape, so within a few percent)
    assert got["avg"] == pytest.approx(got["true_avg"], rel=0.05)
    assert got["grid"] > 0, got["model"]
    # dataset[i] of the plain dataset timed at every item but the untimed first (40 items, 64 asked)
    assert got["spread"]["n"] == 39 and 0 < got["spread"]["p50_s"] <= got["spread"]["max_s"]


def test_dsanalyzer_imports_without_coordl():
    code = (
        "import sys; sys.modules['coordl'] = None\n"
        "import dsanalyzer, dsanalyzer.jobs.torch_loader, dsanalyzer.measure.runs, dsanalyzer.intercept, dsanalyzer.report\n"
        "from dsanalyzer.jobs.item_source import find_item_source\nfrom dsanalyzer.jobs.coordl_loader import is_coordl_loader\n"
        "class L: dataset = [1, 2]\n"
        "assert find_item_source(L()) is None and not is_coordl_loader(L())\n"
        "assert dsanalyzer.profile and dsanalyzer.load_report\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr

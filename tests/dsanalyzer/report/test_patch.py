"""The change ``dsanalyzer fix`` keeps, as a unified diff of the script's loader call (or the lines to add)."""

from __future__ import annotations

import subprocess

from dsanalyzer.report.patch import lines_to_add, script_patch

SCRIPT = """import sys
import torch
from torch.utils.data import DataLoader

data = list(range(10))
loader = DataLoader(data, 32,
                    shuffle=True, num_workers=1)
val = DataLoader(data, batch_size=4)
"""


def _apply(tmp_path, patch: str) -> str:
    subprocess.run(["patch", "-p1", "-s"], input=patch, text=True, cwd=tmp_path, check=True)
    return (tmp_path / "train.py").read_text()


def test_the_loader_call_at_the_site_gets_the_arguments_the_switch_and_the_threads(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    site = {"file": str(tmp_path / "train.py"), "line": 7}  # the call's second line: the call spans it
    patch = script_patch(site, {"num_workers": 2, "cache_bytes": 5000000}, "coordl.DataLoader", 1)
    assert patch.startswith("--- a/train.py\n+++ b/train.py\n")
    new = _apply(tmp_path, patch)
    assert (
        "loader = coordl.DataLoader(data, 32,\n                    shuffle=True, num_workers=2, cache_bytes=5000000)"
        in new
    )
    assert "import torch\ntorch.set_num_threads(1)\n" in new and "import coordl\n" in new
    assert "val = DataLoader(data, batch_size=4)" in new  # the other loader untouched
    compile(new, "train.py", "exec")


def test_an_argument_passed_by_position_is_replaced_in_place(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(
        "from torch.utils.data import DataLoader\nl = DataLoader([1], 1, False, None, None, 0)\n"
    )
    monkeypatch.chdir(tmp_path)
    new = _apply(tmp_path, script_patch({"file": str(tmp_path / "train.py"), "line": 2}, {"num_workers": 3}))
    assert "DataLoader([1], 1, False, None, None, 3)" in new


def test_no_call_at_the_site_gives_no_patch_and_the_lines_to_add_instead(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    assert script_patch({"file": str(tmp_path / "train.py"), "line": 5}, {"num_workers": 2}) is None
    assert script_patch({"file": str(tmp_path / "gone.py"), "line": 5}, {"num_workers": 2}) is None
    assert script_patch(None, {"num_workers": 2}) is None
    assert lines_to_add({"num_workers": 2}, "", 1) == [
        "after `import torch`: torch.set_num_threads(1)",
        "the loader call: DataLoader(..., num_workers=2)",
    ]

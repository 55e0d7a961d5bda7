"""``import coordl.dali`` stays free of DALI: the core install (no ``[dali]`` extra) can import it."""

from __future__ import annotations

import subprocess
import sys


def test_importing_coordl_dali_does_not_import_dali():
    code = "import sys, coordl.dali; print('nvidia.dali' in sys.modules, sorted(coordl.dali.__all__))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split(" ", 1)[0] == "False"
    assert "DALILoader" in out.stdout and "train_pipeline" in out.stdout

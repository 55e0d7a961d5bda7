"""scripts/wheel.sh (``make wheel-check``): the wheel users install builds, repairs and passes its smoke test.

The script builds the sdist and from it the wheel, repairs it into a manylinux wheel that carries libjpeg, installs
it with torch into a clean virtual env and runs scripts/wheel_smoke.py there from outside the repo (a crop decoded by
the native decoder against the wheel's own libjpeg, the fallback, both commands' --help), then again with the
system's libjpeg hidden in a mount namespace where one can be made. About a minute here (2 cores); slow, so CI runs
it and the fast suite does not.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform != "linux", reason="the wheel check is for manylinux wheels"),
]


@pytest.mark.timeout(600)
def test_wheel_installs_and_passes_its_smoke_test(tmp_path):
    dist = tmp_path / "dist"
    run = subprocess.run(
        ["bash", str(ROOT / "scripts" / "wheel.sh"), "check"],
        env={**os.environ, "COORDL_WHEEL_DIST": str(dist), "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "wheel smoke test passed" in run.stdout, run.stdout
    (wheel,) = dist.glob("coordl-*-manylinux_*_x86_64.whl")
    names = zipfile.ZipFile(wheel).namelist()
    # The repaired wheel carries its libjpeg under a hashed name, and no C sources beside the built extensions.
    assert any(n.startswith("coordl.libs/libjpeg-") for n in names), names
    assert not [n for n in names if n.endswith((".c", ".h"))]

"""A clone named ``coordl`` in the folder Python starts from: ``import coordl`` says so instead of an empty module.

Real subprocesses in a temporary folder holding a folder named ``coordl`` that is the repository (a symlink to this
checkout). The guard is loaded the way ``scripts/setup.sh`` installs it: a ``.pth`` file in a site directory that
imports ``_coordl_import_guard`` (``site.addsitedir`` processes ``.pth`` files as start-up does).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GUARD = REPO / "scripts" / "coordl_import_guard.py"


def _python(code: str, cwd: Path, site_dir: Path | None, pythonpath: str | None = None):
    prelude = f"import site; site.addsitedir({str(site_dir)!r}); " if site_dir is not None else ""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run(
        [sys.executable, "-c", prelude + code], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def site_dir(tmp_path: Path) -> Path:
    """A site directory laid out as scripts/setup.sh lays out the venv's site-packages."""
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(GUARD, site / "_coordl_import_guard.py")
    (site / "_coordl_import_guard.pth").write_text("import _coordl_import_guard\n")
    return site


@pytest.fixture
def parent_of_clone(tmp_path: Path) -> Path:
    parent = tmp_path / "home"
    parent.mkdir()
    (parent / "coordl").symlink_to(REPO, target_is_directory=True)
    return parent


def test_without_the_guard_the_clone_is_an_empty_namespace(parent_of_clone):
    """The problem itself: Python imports the clone's root (unless the venv already has the guard)."""
    proc = _python(
        "import coordl; print(coordl.__file__, hasattr(coordl, 'ImageFolder'))", parent_of_clone, None
    )
    guarded = "is a clone of the coordl repository" in proc.stderr  # setup.sh installed it in this venv
    assert guarded or proc.stdout.split() == ["None", "False"], proc.stdout + proc.stderr


def test_guard_names_the_clone_and_the_fix(parent_of_clone, site_dir):
    proc = _python("import coordl", parent_of_clone, site_dir)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: import coordl: ")
    assert f"{parent_of_clone / 'coordl'} is a clone of the coordl repository" in last
    assert f"Python was started in {parent_of_clone}" in last and "cd " in last


def test_guard_leaves_normal_imports_alone(tmp_path, site_dir):
    """From any other folder the package imports as usual, and unrelated namespace packages still work."""
    (tmp_path / "elsewhere" / "nsdemo").mkdir(parents=True)
    (tmp_path / "elsewhere" / "nsdemo" / "mod.py").write_text("X = 1\n")
    code = "import coordl, nsdemo.mod; print(coordl.ImageFolder.__name__, nsdemo.mod.X)"
    proc = _python(code, tmp_path / "elsewhere", site_dir, pythonpath=str(REPO))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["ImageFolder", "1"]


def test_a_clone_on_pythonpath_as_the_project_is_not_refused(parent_of_clone, site_dir):
    """A regular package anywhere on sys.path wins over the clone's root: nothing to refuse then."""
    proc = _python("import coordl; print(coordl.__file__)", parent_of_clone, site_dir, pythonpath=str(REPO))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(REPO / "coordl" / "__init__.py")

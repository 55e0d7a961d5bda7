"""``coordl.__version__`` is the installed distribution's, and pyproject.toml's version moves with CHANGELOG.md."""

from __future__ import annotations

import importlib.metadata
import json
import re
from pathlib import Path

import pytest

import coordl

ROOT = Path(__file__).resolve().parents[2]


def _pyproject_version() -> str:
    # (a pattern, not tomllib: the project supports Python 3.10)
    found = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert found is not None, "pyproject.toml has no version"
    return found.group(1)


def test_version_is_the_installed_distributions() -> None:
    assert coordl.__version__ == importlib.metadata.version("coordl")
    assert "__version__" in coordl.__all__


def test_the_changelogs_newest_version_is_pyprojects() -> None:
    # "0.5.0.dev0" in pyproject.toml is the changelog's "[Unreleased] - 0.5.0"; a release drops the .dev0.
    version = _pyproject_version()
    newest = re.search(
        r"^## \[(?:Unreleased\] - )?([0-9][^\]\s]*)", (ROOT / "CHANGELOG.md").read_text(), re.M
    )
    assert newest is not None, "CHANGELOG.md has no version heading"
    assert version.removesuffix(".dev0") == newest.group(1)


def test_the_installed_version_is_this_checkouts() -> None:
    dist = importlib.metadata.distribution("coordl")
    url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
    if url != ROOT.as_uri():
        pytest.skip(f"the installed coordl is {url or 'not an editable install'}, not this checkout ({ROOT})")
    assert dist.version == _pyproject_version(), (
        "pyproject.toml changed since the install: run scripts/setup.sh"
    )

"""``coordl.__version__``: the installed distribution's version (pyproject.toml's, which moves with CHANGELOG.md).

Read from the package metadata on first use, not at ``import coordl``: importlib.metadata costs ~25 ms to import.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("coordl")
except PackageNotFoundError:  # the source tree on sys.path without an install
    __version__ = "0+unknown"

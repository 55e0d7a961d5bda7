"""Makes ``import coordl`` say what is wrong when a clone of the repository hides the installed package.

A clone is a folder named ``coordl`` holding the package folder ``coordl/``, ``pyproject.toml`` and the rest, but no
``__init__.py``. Python searches the folder it was started from first (``python train.py`` or a REPL in the clone's
parent folder), finds that folder, and, having no better match on ``sys.path`` (an editable install is found by a
finder that runs later), imports it as an empty namespace package: ``coordl.ImageFolder`` then fails with
``AttributeError: module 'coordl' has no attribute 'ImageFolder'``, which says nothing about the cause.

No code of the project runs in that case, so the check has to be in place before the import: ``scripts/setup.sh``
copies this file into the virtual environment's site-packages as ``_coordl_import_guard.py`` with a one-line
``_coordl_import_guard.pth`` that imports it at interpreter start-up. It puts a finder first on ``sys.meta_path``
that, for the project's top-level names only, asks the standard path finder what it would import; when that is a
namespace package made of a clone's root, it raises ImportError explaining the cause and the fix. Any other import
costs one set lookup.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import ModuleSpec, PathFinder
from typing import Any

__all__ = ["CloneShadowGuard", "install"]

PACKAGES = frozenset({"coordl", "dsanalyzer", "gradcomp", "memcache", "nfs_cache", "shmem"})


def _is_clone_root(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "pyproject.toml")) and os.path.isfile(
        os.path.join(folder, "coordl", "__init__.py")
    )


class CloneShadowGuard:
    """Meta path finder: refuses to import a clone's root folder as one of the project's packages."""

    @staticmethod
    def find_spec(fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if path is not None or fullname not in PACKAGES:
            return None
        spec = PathFinder.find_spec(fullname)
        if spec is None or spec.origin is not None or not spec.submodule_search_locations:
            return None  # a regular package or module (or nothing): the usual search decides
        clones = [loc for loc in spec.submodule_search_locations if _is_clone_root(loc)]
        if clones:
            clone = clones[0]
            raise ImportError(
                f"import {fullname}: {clone} is a clone of the coordl repository, not the {fullname} package. "
                f"Python was started in {os.path.dirname(clone) or os.getcwd()}, which it searches first, and the "
                f"clone's folder hides the installed package. Start Python from another folder (e.g. cd {clone}), "
                "or rename the clone.",
                name=fullname,
            )
        return None


def install() -> None:
    """Put the guard first on ``sys.meta_path`` (once)."""
    if not any(f is CloneShadowGuard for f in sys.meta_path):
        sys.meta_path.insert(0, CloneShadowGuard)


install()

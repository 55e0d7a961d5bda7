"""Where the training script built its loader: the file and line of the ``DataLoader(...)`` call.

The import hook wraps the loader classes' ``__init__`` (:mod:`dsanalyzer.intercept`); each construction
records the first frame of its stack that is not torch's, coordl's or dsanalyzer's own code: the line of
the script that called it. ``dsanalyzer fix`` applies a change to the loader built at that line only
(a validation loader built elsewhere keeps its arguments) and writes its patch there. A loader built
inside a framework (Lightning's ``DataModule`` hooks are the script's; a library's own loader is not)
records the library's line: the patch then names a file that is not the script's.
"""

from __future__ import annotations

import os
import sys
import weakref
from typing import Any

__all__ = ["caller_site", "record", "site_of"]

_SITES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _own_dirs() -> tuple[str, ...]:
    """The package directories whose frames are not the script's: torch, coordl and dsanalyzer."""
    dirs = []
    for name in ("torch", "coordl", "dsanalyzer"):
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path:
            dirs.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    return tuple(dirs)


def caller_site(depth: int = 1) -> dict | None:
    """``{"file", "line"}`` of the first frame above this call outside torch, coordl and dsanalyzer."""
    own = _own_dirs()
    frame = sys._getframe(depth)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith("<"):
            path = os.path.abspath(name)
            if not path.startswith(own):
                return {"file": path, "line": int(frame.f_lineno)}
        frame = frame.f_back  # type: ignore[assignment]
    return None


def record(loader: Any, site: dict | None) -> None:
    """Remember where ``loader`` was built (the outermost construction's site; a loader that cannot be
    weakly referenced is not recorded)."""
    if site is None:
        return
    try:
        _SITES.setdefault(loader, site)
    except TypeError:
        pass


def site_of(loader: Any) -> dict | None:
    """Where ``loader`` was built (None: not seen being built, e.g. built before the hook was installed)."""
    try:
        return _SITES.get(loader)
    except TypeError:
        return None

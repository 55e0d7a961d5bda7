"""Item size and data files of a dataset that does not list them: watch which files it opens.

A plain ``torch.utils.data.Dataset`` that opens ``self.paths[i]`` with PIL has no attribute that
says where its data are. :func:`trace_item_files` loads a few items in this process with a
``sys.addaudithook`` hook recording every file opened for reading, then takes the sizes of those
files: the mean bytes one item reads, the files themselves, and their directory. Python's own
imports (``.py``, ``.so`` under the interpreter's prefix) are left out.

When the dataset opens no files (data in memory, a database it keeps open, a network client), the
result is empty and the report asks for ``--data``.
"""

from __future__ import annotations

import os
import random
import stat
import sys
import threading
from typing import Any

from dsanalyzer.measure import fetchrate

__all__ = ["trace_item_files", "merge", "MISSING_SIZE_HINT"]

MISSING_SIZE_HINT = (
    "dsanalyzer could not see which files the dataset reads; give the dataset's directory with "
    "`dsanalyzer profile --data DIR -- ...` (or data_path= in dsanalyzer.profile)"
)

_CODE_SUFFIXES = (".py", ".pyc", ".so", ".pth", ".json", ".cfg", ".txt")
_SAMPLE_ITEMS = 24

_lock = threading.Lock()
_opened: list[str] | None = None  # the paths recorded while a trace is on; None when off
_hook_installed = False


def _audit(event: str, args: tuple) -> None:
    # Called for every audited event in the process: return at once unless a trace is on.
    if _opened is None or event != "open":
        return
    path, mode, flags = args
    if isinstance(path, int) or path is None:
        return
    if mode is not None:
        reading = not any(c in str(mode) for c in "wax+")
    else:
        reading = (flags or 0) & os.O_ACCMODE == os.O_RDONLY
    if reading:
        _opened.append(os.fsdecode(path))


def _data_file(path: str) -> bool:
    if path.endswith(_CODE_SUFFIXES) or path.startswith(
        (sys.prefix, sys.base_prefix, "/proc", "/sys", "/dev")
    ):
        return False
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _opened_by(dataset: Any, index: int) -> list[str]:
    global _opened, _hook_installed
    with _lock:
        if not _hook_installed:
            sys.addaudithook(_audit)  # cannot be removed: it stays idle while _opened is None
            _hook_installed = True
        _opened = []
        try:
            dataset[index]
        finally:
            seen, _opened = _opened, None
    return sorted({os.path.abspath(p) for p in seen if _data_file(p)})


def trace_item_files(dataset: Any, samples: int = _SAMPLE_ITEMS, seed: int = 0) -> dict:
    """Load up to ``samples`` random items; the files they opened and their mean bytes per item.

        Returns ``{}`` when the dataset has no length, fails to load, or its items open only empty
    files; ``{"opened_no_files": True, "method"}`` when every item loaded without opening a file; else
        ``files`` (the dataset's files when their directory holds about one per item, else the opened
        ones), ``avg_item_bytes``, ``path`` (their common directory) and ``method``.
    """
    try:
        n = len(dataset)
    except TypeError:
        return {}
    if n <= 0 or not hasattr(dataset, "__getitem__"):
        return {}
    indices = random.Random(seed).sample(range(n), min(samples, n))
    per_item: list[int] = []
    opened: set[str] = set()
    try:
        for i in indices:
            files = _opened_by(dataset, i)
            opened.update(files)
            per_item.append(sum(os.path.getsize(p) for p in files))
    except Exception:  # a dataset that cannot load an item here is measured another way or not at all
        return {}
    if not opened:  # every item loaded and none opened a file: the data are in memory (or generated)
        return {"opened_no_files": True, "method": f"loaded {len(indices)} items: none opened a file"}
    if not any(per_item):
        return {}
    root = os.path.commonpath(sorted(opened))
    root = root if os.path.isdir(root) else os.path.dirname(root)
    files = sorted(opened)
    suffixes = {os.path.splitext(p)[1] for p in opened}
    per_item_files = len(opened) / len(indices)
    listed = [p for p in fetchrate.files_under(root) if os.path.splitext(p)[1] in suffixes]
    if 0.5 * n * per_item_files <= len(listed) <= 2 * n * per_item_files:
        files = listed  # the directory holds the dataset: evict and sample all of it
    return {
        "files": files,
        "avg_item_bytes": sum(per_item) / len(per_item),
        "path": root,
        "method": f"files opened while loading {len(indices)} items",
    }


def merge(dataset_info: dict, traced: dict) -> dict:
    """``dataset_info`` with the traced size and path filled in where it had none."""
    if not traced:
        return {**dataset_info, "avg_item_bytes": None, "size_note": MISSING_SIZE_HINT}
    if traced.get("opened_no_files"):
        return {
            **dataset_info,
            "avg_item_bytes": 0.0,
            "bytes": 0,
            "reads_no_files": True,
            "size_method": f"{traced['method']} (tensors in memory, generated samples): the what-if "
            "models fetch as free (a dataset that reads over a network: its cost is not in the what-if)",
        }
    items = int(dataset_info.get("items") or 0)
    avg = float(traced["avg_item_bytes"])
    return {
        **dataset_info,
        "avg_item_bytes": avg,
        "bytes": int(avg * items),
        "path": traced["path"],
        "size_method": traced["method"],
    }

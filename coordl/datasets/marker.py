"""The marker file of a generated dataset: a directory holds a complete dataset of these parameters, or nothing of ours.

``coordl synth`` and ``coordl synth --photos`` write their files first and a marker with their parameters
last, so a directory with the marker holds the whole dataset; calling them again with the same parameters
returns at once, and another dataset (or anybody's files) in the way is an error, never overwritten.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["check_root"]


def check_root(root: Path, params: dict, marker_name: str) -> bool:
    """True when ``root`` already holds this dataset; raises if it holds something else."""
    marker = root / marker_name
    if marker.exists():
        try:
            old = json.loads(marker.read_text())
        except ValueError:
            old = None
        if old == params:
            return True
        raise FileExistsError(
            f"{root} holds a synthetic dataset with other parameters ({old}); "
            f"asked for {params}. Remove it or pick another root."
        )
    if root.exists() and not root.is_dir():
        raise NotADirectoryError(f"{root} is a file, not a directory: pick a new or empty directory")
    if root.exists():
        foreign = [p.name for p in root.iterdir() if not p.name.startswith("class_")]
        if foreign:
            raise FileExistsError(
                f"{root} is not empty and not a coordl synthetic dataset (has {foreign[:3]})"
            )
    return False

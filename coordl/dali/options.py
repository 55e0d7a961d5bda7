"""The options of ``coordl.dali.DALILoader`` that need checking or a decision: device, start method.

Kept apart from the loader so the rules are read in one place: bad values are refused naming the
option, and nothing here initialises CUDA (DALI forks its workers after these run).
"""

from __future__ import annotations

import os
from typing import Any

import torch

__all__ = ["device_id_for", "start_method", "validate"]


def device_id_for(device: str, device_id: int | None) -> int | None:
    """None for a CPU-only pipeline; for "gpu", the given id, ``LOCAL_RANK``, or the current device.

    Nothing here initialises CUDA (``torch.cuda.is_available()`` would): DALI forks its workers after
    this, and a process that has initialised CUDA cannot fork them. A missing GPU is reported when
    the pipeline is built.
    """
    if device == "cpu":
        return None
    if device_id is not None:
        return int(device_id)
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    return torch.cuda.current_device() if torch.cuda.is_initialized() else 0


def start_method(requested: str | None) -> str:
    """``py_start_method``: as given, else "fork" unless CUDA is already initialised here ("spawn")."""
    if requested is not None:
        return requested
    try:
        from nvidia.dali import backend

        # (DALI's backend stub leaves it out; an older DALI without it raises AttributeError, caught below)
        cuda_up = bool(backend.IsDriverInitialized())  # type: ignore[attr-defined]
    except (ImportError, AttributeError):
        cuda_up = torch.cuda.is_initialized()
    return "spawn" if cuda_up or torch.cuda.is_initialized() else "fork"


def validate(
    batch_size: Any,
    device: str,
    cache_bytes: Any,
    py_num_workers: Any,
    py_start_method: str | None,
    depth: Any,
) -> None:
    """Refuse bad values naming the option."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"DALILoader: batch_size must be an int >= 1 (DALI batches), got {batch_size!r}")
    if device not in ("cpu", "gpu"):
        raise ValueError(f"DALILoader: device must be 'cpu' or 'gpu', got {device!r}")
    if not isinstance(cache_bytes, int) or isinstance(cache_bytes, bool) or cache_bytes < 0:
        raise ValueError(f"DALILoader: cache_bytes must be an int >= 0 (bytes), got {cache_bytes!r}")
    if not isinstance(py_num_workers, int) or py_num_workers < 0:
        raise ValueError(f"DALILoader: py_num_workers must be an int >= 0, got {py_num_workers!r}")
    if py_start_method not in (None, "fork", "spawn"):
        raise ValueError(f"DALILoader: py_start_method must be 'fork' or 'spawn', got {py_start_method!r}")
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"DALILoader: prefetch_queue_depth must be an int >= 1, got {depth!r}")

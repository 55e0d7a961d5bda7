"""Checks of ``coordl.DataLoader``'s own options (torch checks its own), each error naming the option."""

from __future__ import annotations

from typing import Any

import torch.utils.data

from coordl.datasets.source import has_split_prep
from coordl.fetch.pagecache import check_mode

__all__ = ["check_dataset_options", "validate_options"]


def validate_options(
    cache_bytes: Any,
    on_error: str,
    batch_size: Any,
    batch_sampler: Any,
    timeout: Any,
    batch_ring: Any,
    fetch_ahead: Any,
    page_cache: Any = "auto",
) -> None:
    """Refuse bad values of coordl's own options (torch checks its own), naming the option."""
    if not isinstance(cache_bytes, int) or isinstance(cache_bytes, bool) or cache_bytes < 0:
        raise ValueError(f"cache_bytes must be an int >= 0 (bytes), got {cache_bytes!r}")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if on_error == "skip" and batch_size is None and batch_sampler is None:
        raise ValueError(
            "on_error='skip' needs batching: with batch_size=None a skipped item cannot be dropped"
        )
    if timeout < 0:
        raise ValueError(f"timeout option should be non-negative (seconds), got timeout={timeout!r}")
    if batch_ring not in (True, False, "copy"):
        raise ValueError(f"batch_ring must be True, False or 'copy', got {batch_ring!r}")
    if fetch_ahead is not None and (not isinstance(fetch_ahead, int) or fetch_ahead < 0):
        raise ValueError(f"fetch_ahead must be an int >= 0 or None, got {fetch_ahead!r}")
    check_mode(page_cache)


def check_dataset_options(
    dataset: Any, source: Any, *, cache_bytes: int, sample_cache: Any, on_error: str
) -> None:
    """Refuse options the dataset cannot support, naming the option."""
    name = type(dataset).__name__
    if isinstance(dataset, torch.utils.data.IterableDataset):
        if cache_bytes or sample_cache is not None or on_error != "raise":
            raise ValueError(
                f"cache_bytes=, sample_cache= and on_error= need a map-style dataset; {name} is an IterableDataset"
            )
        return
    if sample_cache is not None and not has_split_prep(source):
        raise ValueError(
            f"sample_cache= needs a dataset whose prep is split into prep_deterministic/prep_random; "
            f"{name} has no such split (use coordl.ImageFolder or add the methods)"
        )

"""How a change reads in the job's own terms: the loader call (or the line) that applies it.

A DataLoader's prep parallelism is ``num_workers``, a DALI pipeline's ``num_threads``; a change that
needs coordl's loader (a cache, read-ahead) is a ``coordl.DataLoader(...)`` call; the main process's
intra-op threads are one line of the training script. The verdict, the ranked remedies and
``dsanalyzer fix`` all print changes through :func:`change_text`.
"""

from __future__ import annotations

__all__ = ["is_dali", "workers_noun", "change_text", "COORDL_ARGS"]

# arguments only coordl's loader takes: a torch loader needs switching to coordl.DataLoader for them
COORDL_ARGS = ("cache_bytes", "fetch_ahead", "sample_cache", "partitioned", "coordinate", "remote_prep")


def is_dali(report: dict) -> bool:
    """Whether the profiled loader is a DALI iterator or ``coordl.dali.DALILoader`` (prep on DALI threads)."""
    loader = report.get("loader") or {}
    return bool(loader.get("pipelines")) or ".dali." in str(loader.get("class", ""))


def workers_noun(report: dict) -> str:
    """What the job's prep parallelism is called, with the argument that sets it: ``num_workers`` of a
    DataLoader, ``num_threads`` of a DALI pipeline."""
    return "DALI CPU threads (num_threads)" if is_dali(report) else "loader workers (num_workers)"


def change_text(change: dict, report: dict) -> str:
    """The change as code; ``change`` keeps the key ``num_workers`` (what verify reads), a DALI job is
    told its own argument, ``num_threads``. ``torch_threads`` is the script's line, ``loader`` a class
    to build instead of the job's."""
    change = dict(change)
    if "torch_threads" in change:
        return f"torch.set_num_threads({change.pop('torch_threads')})"
    if is_dali(report):
        args = ", ".join(f"{'num_threads' if k == 'num_workers' else k}={v}" for k, v in change.items())
        plain = not str((report.get("loader") or {}).get("class", "")).startswith("coordl.")
        if plain and "cache_bytes" not in change:
            return f"Pipeline(..., {args})"
        return f"coordl.dali.DALILoader(..., {args})"
    cls = change.pop("loader", None)
    args = ", ".join(f"{k}={v}" for k, v in change.items())
    if cls is None:
        cls = "coordl.DataLoader" if any(k in change for k in COORDL_ARGS) else "DataLoader"
    return f"{cls}(..., {args})"

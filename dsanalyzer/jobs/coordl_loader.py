"""The coordl DataLoader as a job kind: how the differential runs serve its raw items from memory.

A ``coordl.DataLoader`` takes a fetch tier through its public ``add_fetch_tier`` (asked before every
other tier): :class:`MemoryTier` answers every read from a dict, so the prep run measures prep alone.
Everything else about it (its dataset, its ``num_workers``) is torch's DataLoader's, in
:mod:`dsanalyzer.jobs.torch_loader`. coordl is imported only when the loader comes from it (then it
is already loaded): dsanalyzer works without coordl installed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from dsanalyzer.measure import remedy_probes as probes

__all__ = [
    "is_coordl_loader",
    "MemoryTier",
    "serve_tier",
    "fetch_ahead",
    "fresh_iter",
    "remedy_probes",
    "remote_counters",
    "remote_facts",
]


def is_coordl_loader(loader: Any) -> bool:
    """True for a ``coordl.DataLoader`` (coordl is imported only when the object comes from it)."""
    if type(loader).__module__.partition(".")[0] != "coordl":
        return False
    from coordl.dataloader import DataLoader

    return isinstance(loader, DataLoader)


class MemoryTier:
    """A coordl fetch tier (``coordl.fetch.pipeline.FetchTier``) answering every read from a dict."""

    name = "dsanalyzer-memory"
    in_memory = True

    def __init__(self, fetch: Callable[[int], bytes]) -> None:
        self._fetch = fetch  # answers every index (jobs.item_source.MemoryFetch: a dict, substituting)
        self.hits = 0

    def get(self, index: int) -> bytes:
        self.hits += 1
        return self._fetch(index)

    def offer(self, index: int, raw: bytes | memoryview) -> None:
        """Every read hits: nothing is ever offered."""

    def stats(self) -> dict[str, int]:
        return {"dsanalyzer_memory_hits": self.hits}


def serve_tier(loader: Any, fetch: Callable[[int], bytes]) -> Callable[[], None] | None:
    """Put a :class:`MemoryTier` answering with ``fetch`` in front of a coordl loader's tiers; the undo,
    or None when ``loader`` is not a coordl loader over an item source."""
    if not is_coordl_loader(loader) or getattr(loader, "source", None) is None:
        return None
    tier = MemoryTier(fetch)
    loader.add_fetch_tier(tier)
    return lambda: loader.remove_fetch_tier(tier)


def fetch_ahead(loader: Any) -> int:
    """Items each worker reads ahead in background threads (coordl's ``fetch_ahead``; 0 for torch's loader).

    ``DataLoader(fetch_ahead=None)`` means coordl's default for a source whose ``fetch`` is thread-safe.
    """
    if not is_coordl_loader(loader):
        return 0
    value = getattr(loader, "fetch_ahead", None)
    if value is None:
        from coordl.dataloader import DEFAULT_FETCH_AHEAD

        thread_safe = getattr(getattr(loader, "source", None), "thread_safe_fetch", False) is True
        value = DEFAULT_FETCH_AHEAD if thread_safe else 0
    return int(value)


def remote_facts(loader: Any) -> dict:
    """What the remote-prep what-if needs of a coordl loader: ``remote_cpus`` (its live actors; 0
    without ``remote_prep=``) and ``remote_wire_bytes``, what one sample weighs on its way back from a
    remote CPU (the uint8 array of :mod:`coordl.remote.compact`, measured on item 0; None when the
    dataset's transform sends the collated sample, or for another loader)."""
    if not is_coordl_loader(loader):
        return {}
    import torch

    from coordl.remote.compact import compact_source, wire_bytes

    cpus = int(loader.stats().get("remote_actors", 0) or 0)
    compact = compact_source(getattr(loader, "source", None))
    if compact is None or not len(compact[0]):
        return {"remote_cpus": cpus, "remote_wire_bytes": None}
    source = compact[0]
    with torch.random.fork_rng(devices=[]):  # the user's random state stays as it was
        try:
            size = float(wire_bytes(source.prep(source.fetch(0), 0)))
        except Exception:  # noqa: BLE001 - a dataset's item 0 may fail to prep: then unknown
            size = None
    return {"remote_cpus": cpus, "remote_wire_bytes": size}


def remote_counters(loader: Any) -> Callable[[], dict[str, float]] | None:
    """What to read of a coordl loader with ``remote_prep=`` to split a run's rate between its remote
    and local sides (``remote_items``, handed out from the actors); None for any other loader."""
    if not is_coordl_loader(loader) or getattr(loader, "remote_prep", None) is None:
        return None
    return lambda: {"remote_items": float(loader.stats().get("remote_items", 0) or 0)}


def fresh_iter(loader: Any, own_iter: Callable[[], Iterator]) -> Callable[[], Iterator] | None:
    """A new iterator per call, for the loader-alone runs at each worker count (None: the job's own).

    torch's ``__iter__`` reuses persistent workers, so torch's loader gives its ``_get_iterator``. A
    coordl loader gives its own ``iter`` (``own_iter``): its ``_get_iterator`` is torch's, which skips
    coordl's path (the batch ring, its tiers' epoch) and cost 1.7-1.9 ms of CPU a sample where the
    job's own iterator costs 1.2-1.4 (the standard recipe, one worker, 2-core VM, 2026-11-27): the prep
    curve came out 30-50% below the real run's rate. coordl starts new workers at the ``iter`` after
    ``num_workers`` changed, which is what the loader-alone runs do between worker counts; with
    persistent workers it would keep the old ones (and their tiers), so those take torch's path still.
    """
    if is_coordl_loader(loader) and not getattr(loader, "persistent_workers", False):
        return own_iter
    get = getattr(loader, "_get_iterator", None)
    return get if callable(get) else None


def _failed(e: BaseException) -> dict:
    return {
        "not_measured": f"the probe failed: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
    }


def remedy_probes(loader: Any, take_batch: Callable[[], Any]) -> dict:
    """What the what-ifs of ``coordinate=`` and ``sample_cache=`` need (:mod:`dsanalyzer.measure.remedy_probes`),
    or why each was not measured: both are coordl's, and the sample cache needs a source that splits its prep."""
    if not is_coordl_loader(loader):
        why = f"{{}}= is coordl.DataLoader's; this loader is {type(loader).__module__}.{type(loader).__qualname__}"
        return {"coordinate": {"not_measured": why.format("coordinate")},
                "sample_cache": {"not_measured": why.format("sample_cache")}}  # fmt: skip
    from coordl.coordinated import batchcodec
    from coordl.datasets.source import has_split_prep
    from coordl.fetch.sample_cache import import_memcache

    out: dict = {}
    try:
        out["coordinate"] = probes.shared_batch(take_batch(), batchcodec)
    except Exception as e:  # noqa: BLE001 - a batch the ring cannot hold, a loader that fails: say so
        out["coordinate"] = _failed(e)
    source = getattr(loader, "source", None)
    if source is None or not has_split_prep(source):
        kind = "no item source" if source is None else f"its source ({type(source).__qualname__})"
        out["sample_cache"] = {"not_measured": f"{kind} does not split prep into prep_deterministic and "
                               "prep_random: only the deterministic prefix can be cached"}  # fmt: skip
        return out
    try:
        memcache = import_memcache()
        store = lambda cap: memcache.LocalStore(cap, name=f"dsanalyzer_probe_{os.getpid()}")  # noqa: E731
        out["sample_cache"] = probes.split_prep(source, store)
    except Exception as e:  # noqa: BLE001
        out["sample_cache"] = _failed(e)
    return out

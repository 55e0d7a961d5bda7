"""The dataset a ``coordl.DataLoader`` shows the world: the user's dataset, read through coordl's fetch tiers.

Frameworks rebuild a loader from the attributes of the one they were given. Accelerate's
``prepare_data_loader`` makes a plain ``torch.utils.data.DataLoader`` over ``loader.dataset`` with
``loader.collate_fn``; nothing else of the original loader survives. So ``loader.dataset`` is this view:
indexing it runs the same path as coordl's own workers (MinIO cache, partitioned cache, sample cache,
then storage, then prep) with the same shared counters, and it returns what the user's dataset returns
for that index, so the user's ``collate_fn`` works on it unchanged. Everything else (``len``, ``classes``,
any attribute of the user's dataset) is the user's dataset's; the dataset itself is ``view.dataset``.

A view has no batch ring (the collate function that reads it is the user's, not coordl's ring
collate) and no worker table (worker deaths are reported by torch there). A ``coordl.DataLoader``
built on a view (Lightning re-instantiating one from its attributes) unwraps it: the new loader reads
the user's dataset with the coordl options of the loader the view came from unless it was given its
own, and, when those options are the same, it takes over the view's fetch side (source, counters, cache,
the view itself) instead of building a second one: Lightning's ``DistributedSampler`` keeps the old view
alive for as long as training runs, so a second set would stay allocated beside it. The loader that
holds a view last (its ``owner``) closes it. That matters when Lightning's patching only saw torch's ``__init__`` (the
``coordl.DataLoader`` class was first imported inside a ``*_dataloader`` hook, after Lightning wrapped
the ``__init__`` of the subclasses that existed): it then rebuilds the loader from torch's arguments.
"""

from __future__ import annotations

from typing import Any

from coordl.fetch.pipeline import LoaderSource

__all__ = ["COORDL_OPTIONS", "DatasetView", "unwrap_view"]

# coordl.DataLoader's own arguments and their defaults.
COORDL_OPTIONS: dict[str, Any] = {
    "cache_bytes": 0, "cache_dir": None, "on_error": "raise", "sample_cache": None, "partitioned": False,
    "coordinate": None, "batch_ring": True, "fetch_ahead": None, "page_cache": "auto",
}  # fmt: skip


class DatasetView(LoaderSource):
    """The user's ``dataset`` read through a loader's fetch tiers (see the module docstring).

    Args:
        dataset: the user's dataset, as given to the loader.
        source, tiers, counters, **options: as for :class:`~coordl.fetch.pipeline.LoaderSource`.
    """

    def __init__(self, dataset: Any, source: Any, tiers: Any, counters: Any, **options: Any) -> None:
        super().__init__(source, tiers, counters, **options)
        self.dataset = dataset
        self.loader_options: dict[str, Any] = dict(COORDL_OPTIONS)  # the loader's, set by the loader
        self.chain: Any = None  # the loader's coordl.fetch.chain.FetchChain, which these tiers come from
        self.owner: Any = None  # a weak reference to the loader that closes this view and its chain
        self.closed = False

    def reusable(self, options: dict[str, Any]) -> bool:
        """Whether a loader built with ``options`` can take over this view's fetch side."""
        return not self.closed and self.chain is not None and self.loader_options == options

    def close(self) -> None:
        self.closed = True
        super().close()

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the view lacks: the user's dataset's attributes (classes, samples...).
        dataset = self.__dict__.get("dataset")
        if dataset is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(dataset, name)

    def stats(self) -> dict[str, Any]:
        """The user's dataset's own ``stats()`` (if any), then the loader's counters and tiers."""
        own = getattr(self.dataset, "stats", None)
        out: dict[str, Any] = dict(own()) if callable(own) else {}
        out.update(super().stats())
        return out

    def __repr__(self) -> str:
        return f"coordl view of {self.dataset!r} (tiers {[t.name for t in self.tiers]})"


def unwrap_view(dataset: Any, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
    """``(the user's dataset, the coordl options to use)`` for a loader built on ``dataset`` with ``options``.

    For a :class:`DatasetView`: the dataset behind it and, when ``options`` are all defaults, the
    options of the loader the view came from. Otherwise ``dataset`` and ``options`` as given.
    """
    options = dict(COORDL_OPTIONS if options is None else options)
    if not isinstance(dataset, DatasetView):
        return dataset, options
    defaults = all(options[k] is v or options[k] == v for k, v in COORDL_OPTIONS.items())
    return dataset.dataset, dict(dataset.loader_options) if defaults else options

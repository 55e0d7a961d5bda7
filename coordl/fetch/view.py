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
the user's dataset through tiers of its own.
"""

from __future__ import annotations

from typing import Any

from coordl.fetch.pipeline import LoaderSource

__all__ = ["DatasetView", "unwrap_view"]


class DatasetView(LoaderSource):
    """The user's ``dataset`` read through a loader's fetch tiers (see the module docstring).

    Args:
        dataset: the user's dataset, as given to the loader.
        source, tiers, counters, **options: as for :class:`~coordl.fetch.pipeline.LoaderSource`.
    """

    def __init__(self, dataset: Any, source: Any, tiers: Any, counters: Any, **options: Any) -> None:
        super().__init__(source, tiers, counters, **options)
        self.dataset = dataset

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


def unwrap_view(dataset: Any) -> Any:
    """The user's dataset behind ``dataset`` when it is a :class:`DatasetView`, else ``dataset``."""
    return dataset.dataset if isinstance(dataset, DatasetView) else dataset

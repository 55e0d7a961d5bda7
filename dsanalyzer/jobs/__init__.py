"""The kinds of job dsanalyzer understands, one module each, and :func:`prepare`, which picks the kind.

A job kind is what the differential runs must know about a job's loader or trainer to time it:
a plain DALI iterator (:mod:`~dsanalyzer.jobs.dali_iter`, with the readers it finds in the pipeline,
:mod:`~dsanalyzer.jobs.dali_readers`), a sampling GNN loader (:mod:`~dsanalyzer.jobs.gnn`), the
collectives of a torchrun job (:mod:`~dsanalyzer.jobs.comm`, the interface trainers report through),
and the default kind, torch's DataLoader (:mod:`~dsanalyzer.jobs.torch_loader`, with where its items
come from in :mod:`~dsanalyzer.jobs.item_source`) and coordl's (:mod:`~dsanalyzer.jobs.coordl_loader`).
A new kind is a module here, a branch in :func:`prepare` and a test.
Job modules use :mod:`dsanalyzer.measure` and :mod:`dsanalyzer.model`; they never import the
verdict, the report or the command line. Public surface: :func:`prepare` and each module's ``__all__``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dsanalyzer.measure.plan import Prepared, RunPlan

__all__ = ["prepare"]


def prepare(
    plan: RunPlan,
    loader: Any,
    open_iter: Callable[[], Iterator],
    fresh_iter: Callable[[], Iterator] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Prepared:
    """Set ``loader`` up for ``plan.mode`` by its kind (:func:`dsanalyzer.jobs.torch_loader.prepare`'s contract).

    Imports are local: the import hook calls this in every profiled process, at its first iterator.
    """
    from dsanalyzer.jobs import dali_iter, torch_loader
    from dsanalyzer.measure.plan import Prepared
    from dsanalyzer.measure.runs import ReplayIterator

    if dali_iter.is_dali_iterator(loader):  # a user's own DALI pipeline: no dataset, no workers to change
        info, batch = dali_iter.prepare_run(plan, loader, progress)
        return Prepared(info, replay=ReplayIterator(batch) if batch is not None else None)
    return torch_loader.prepare(plan, loader, open_iter, fresh_iter, progress)

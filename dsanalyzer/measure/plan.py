"""The differential runs by name, and what one run is asked to do (:class:`RunPlan`).

A leaf: the profiler builds plans, the hook's config carries one into the job
(:class:`~dsanalyzer.measure.hookconfig.HookConfig` is a RunPlan), the job kinds
(:func:`dsanalyzer.jobs.prepare`) carry them out and say what they did (:class:`Prepared`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dsanalyzer.measure.runs import ReplayIterator

__all__ = ["MODES", "RunPlan", "Prepared"]

# In the order they run: the prep-scaling run measures the dataset the others are compared against.
MODES = ("prep_scaling", "compute", "prep", "real")


@dataclass(frozen=True)
class RunPlan:
    """One differential run: its mode, how long, and the limits it must respect."""

    mode: str
    iters: int = 100
    warmup: int = 5
    workers_list: tuple[int, ...] = (1,)
    data_path: str | None = None
    memory_budget_bytes: int = 1 << 30


@dataclass
class Prepared:
    """What preparing a run did (each job kind's ``prepare``): facts for the result, the compute run's batch, how to undo it."""

    info: dict
    replay: ReplayIterator | None = None
    undo: Callable[[], None] = field(default=lambda: None)

"""The differential runs by name, and what one run is asked to do (:class:`RunPlan`).

A leaf: the profiler builds plans, the hook's config carries one into the job
(:class:`~dsanalyzer.measure.hookconfig.HookConfig` is a RunPlan), :mod:`~dsanalyzer.measure.modes`
and the job kinds carry them out.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MODES", "RunPlan"]

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

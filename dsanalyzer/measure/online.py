"""``dsanalyzer fix --online``, inside the training process: the loader the hook times tunes itself.

The fix runs the script once: a torch ``DataLoader`` is built as ``coordl.DataLoader`` (the hook's switch,
:mod:`dsanalyzer.measure.apply`) and the loader the script iterates first starts tuning
(``tune=True``: :mod:`coordl.tune`) at its first ``iter()``. At each later ``iter()`` (an epoch's start) the
hook asks :meth:`OnlineTune.done`: the run stops once the tuner has judged every change it tried and chose
no other, or after ``tune_epochs`` epochs. :meth:`OnlineTune.facts` is what the run's result holds: the
tuner's log (each change, its predicted and measured items/s, kept or reverted), the loader's knobs as the
script set them and as the tuner kept them, and the rates measured at each.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

__all__ = ["OnlineTune"]


class OnlineTune:
    """The tuning of the one loader a ``fix --online`` run times, and when that run has what it needs."""

    def __init__(self, most_epochs: int) -> None:
        self.most_epochs = int(most_epochs)
        self.tuner: Any = None
        self.first_knobs: dict | None = None
        self.error: str | None = None

    def start(self, loader: Any) -> None:
        """Make ``loader`` (the one the script iterates first) tune itself from its first epoch."""
        if not callable(getattr(loader, "_start_tuning", None)):
            self.error = (
                f"the loader the script iterates is {type(loader).__module__}.{type(loader).__qualname__}: only "
                "coordl.DataLoader tunes itself (a torch DataLoader built in the script is switched to it; "
                "this one is not): run dsanalyzer fix without --online"
            )
            return
        if getattr(loader, "_tuner", None) is None:
            loader._start_tuning(True)
        self.tuner = loader._tuner
        self.first_knobs = asdict(self.tuner.knobs())

    def done(self) -> bool:
        """At an epoch's start: whether the run has what it needs (the epoch before is judged first)."""
        t = self.tuner
        if t is None:
            return self.error is not None  # nothing to tune: stop at once
        self._judge_last_epoch()
        return t.epoch >= self.most_epochs or self._settled()

    def _settled(self) -> bool:
        """The tuner judged its last trial and chose no other (nothing waits for another epoch)."""
        t = self.tuner
        return t.best is not None and t.trial is None and t.pending is None and t.window is None

    def _judge_last_epoch(self) -> None:
        """An epoch that ended without StopIteration (Lightning and Accelerate stop at ``len()``) is judged
        at the next ``iter()``: here, when the hook asks first, or when the script ends after it."""
        if self.tuner is not None and self.tuner.clock is not None:
            self.tuner.epoch_ended()

    def facts(self) -> dict:
        """The run's ``tune`` section (see the module's docstring)."""
        if self.tuner is None:
            return {"error": self.error or "the loader was never iterated"}
        self._judge_last_epoch()
        t = self.tuner
        log = [dict(e) for e in t.log]
        best = t.best
        first_rate = log[0]["before_items_per_s"] if log else (best[1] if best is not None else None)
        return {
            "epochs": t.epoch,
            "most_epochs": self.most_epochs,
            "settled": self._settled(),
            "log": log,
            "first_knobs": self.first_knobs,
            "first_items_per_s": first_rate,
            "knobs": asdict(best[0]) if best is not None else self.first_knobs,
            "items_per_s": best[1] if best is not None else None,
        }

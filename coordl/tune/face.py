"""What ``tune=`` adds to ``coordl.DataLoader``'s public face: the tuner's start, its epoch wrapper, ``tune_log()``."""

from __future__ import annotations

from typing import Any

from coordl.tune.tuner import EpochClock, TunedEpoch, TuneOptions, Tuner

__all__ = ["TunableLoader"]


class TunableLoader:
    """The ``tune=`` part of a loader (a base of ``coordl.DataLoader``)."""

    _tuner: Tuner | None = None
    _pass_length: int | None

    def _start_tuning(self, tune: bool | TuneOptions) -> None:
        if not isinstance(tune, (bool, TuneOptions)):
            raise ValueError(f"tune must be True, False or a coordl.TuneOptions, got {tune!r}")
        self.tune = tune
        self._tuner = Tuner(self, tune if isinstance(tune, TuneOptions) else TuneOptions()) if tune else None

    def _tuning_epoch(self) -> EpochClock | None:
        """At ``iter()``: the tuner applies its next change and times the epoch (None: not tuning)."""
        return self._tuner.epoch_starts() if self._tuner is not None else None

    def _tuned(self, epoch: Any, clock: EpochClock | None) -> Any:
        if self._tuner is None or clock is None:
            return epoch
        return TunedEpoch(epoch, self._tuner, clock, self._pass_length)

    def tune_log(self) -> list[dict[str, Any]]:
        """With ``tune=``: each change made, one dict each (``epoch``, ``knob``, ``change``,
        ``before_items_per_s``, ``predicted_items_per_s``, ``measured_items_per_s``, ``kept``); else []."""
        return [dict(e) for e in self._tuner.log] if self._tuner is not None else []

"""The loader tuning itself: ``coordl.DataLoader(tune=True)`` measures each epoch and changes its own knobs
between epochs, keeping only what measured faster (:mod:`.tuner`); the rate model it predicts with is
pure functions (:mod:`.model`), which tools above coordl may use too."""

from coordl.tune.model import EpochMeasure, Knobs, predict_rate
from coordl.tune.tuner import TuneOptions, Tuner

__all__ = ["EpochMeasure", "Knobs", "TuneOptions", "Tuner", "predict_rate"]

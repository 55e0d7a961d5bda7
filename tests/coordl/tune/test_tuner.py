"""The tuner's decisions, epoch by epoch, on measures given to it (no loader run: each case exact)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from coordl.tune.model import EpochMeasure, Knobs
from coordl.tune.tuner import TuneOptions, Tuner

THREADS = torch.get_num_threads()


def _tuner() -> Tuner:
    inner = SimpleNamespace(_iterator=None, num_workers=1, prefetch_factor=2)
    loader = SimpleNamespace(num_workers=1, prefetch_factor=2, batch_size=32, _torch=inner, _watch=None)
    return Tuner(loader, TuneOptions(knobs=("num_workers", "prefetch_factor")))


def _epoch(tuner: Tuner, rate: float, *, wait_share: float, workers_cpu_share: float) -> None:
    """One epoch at the tuner's knobs now: ``rate`` items/s, the loop waiting ``wait_share`` of the time."""
    tuner.epoch_starts()  # applies the pending change to the loader
    k = tuner.knobs()
    tuner.clock = None
    tuner.observe(EpochMeasure(int(rate), 1.0, wait_share, 0.2, workers_cpu_share * k.num_workers, k, 4))
    tuner.epoch += 1


def test_a_change_that_measured_faster_is_kept() -> None:
    t = _tuner()
    _epoch(t, 1000, wait_share=0.8, workers_cpu_share=1.0)  # prep-bound on 1 worker: try 2
    assert t.pending == Knobs(2, 2, THREADS)
    _epoch(t, 1900, wait_share=0.6, workers_cpu_share=1.0)
    assert t.log[-1]["kept"] and t.log[-1]["change"] == "num_workers 1 -> 2"
    assert t.log[-1]["predicted_items_per_s"] > 1000 and t.log[-1]["measured_items_per_s"] == 1900
    assert t.loader.num_workers == 2


def test_a_change_that_measured_worse_is_reverted_at_the_next_epoch() -> None:
    t = _tuner()
    _epoch(t, 1000, wait_share=0.8, workers_cpu_share=1.0)
    _epoch(t, 900, wait_share=0.8, workers_cpu_share=0.5)  # 2 workers measured slower
    assert t.log[-1]["kept"] is False
    assert t.loader.num_workers == 2  # until the next epoch starts
    _epoch(t, 1000, wait_share=0.8, workers_cpu_share=1.0)
    assert t.loader.num_workers == 1
    assert "num_workers=2" in t.tried  # not tried again


def test_a_change_within_the_noise_is_not_kept() -> None:
    t = _tuner()
    _epoch(t, 1000, wait_share=0.8, workers_cpu_share=1.0)
    _epoch(t, 1020, wait_share=0.8, workers_cpu_share=0.5)  # +2%, under min_gain's 3%
    assert t.log[-1]["kept"] is False


def test_nothing_changes_when_the_trainer_binds() -> None:
    t = _tuner()
    for _ in range(3):
        _epoch(t, 1000, wait_share=0.01, workers_cpu_share=0.3)
    assert t.log == [] and t.pending is None and t.loader.num_workers == 1


def test_workers_that_wait_on_storage_get_more_items_in_flight() -> None:
    t = _tuner()
    _epoch(t, 300, wait_share=0.9, workers_cpu_share=0.05)
    assert t.trial is not None and t.trial["knob"] in ("num_workers=2", "prefetch_factor=4")


def test_a_short_epoch_is_not_judged() -> None:
    t = _tuner()
    _epoch(t, 1000, wait_share=0.8, workers_cpu_share=1.0)
    _epoch(t, 100, wait_share=0.8, workers_cpu_share=1.0)  # under min_items: judged on the next epoch
    assert t.log == [] and t.trial is not None

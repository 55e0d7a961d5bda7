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


def _epoch(tuner: Tuner, rate: float, *, wait_share: float, workers_cpu_share: float, main_cpu_s: float = 0.2,
           cores: int = 4, idle_cores: float | None = None) -> None:  # fmt: skip
    """One epoch at the tuner's knobs now: ``rate`` items/s, the loop waiting ``wait_share`` of the time."""
    tuner.epoch_starts()  # applies the pending change to the loader
    k = tuner.knobs()
    tuner.clock = None
    tuner.observe(
        EpochMeasure(
            int(rate),
            1.0,
            wait_share,
            main_cpu_s,
            workers_cpu_share * k.num_workers,
            k,
            cores,
            idle_cores=idle_cores,
        )
    )
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
    _epoch(t, 700, wait_share=0.8, workers_cpu_share=0.5)  # 2 workers measured slower, past the noise
    assert t.log[-1]["kept"] is False
    assert t.loader.num_workers == 2  # until the next epoch starts
    _epoch(t, 1000, wait_share=0.8, workers_cpu_share=1.0)
    assert t.loader.num_workers == 1
    assert "num_workers=2" in t.tried  # not tried again


def test_a_change_within_the_noise_runs_a_second_epoch_and_is_judged_on_both() -> None:
    t = _tuner()
    _epoch(t, 1000, wait_share=0.8, workers_cpu_share=1.0)
    _epoch(t, 1020, wait_share=0.8, workers_cpu_share=0.5)  # +2%, under min_gain's 3%: not decided yet
    assert t.log == [] and t.trial is not None and t.pending is None  # the trial's knobs run again
    _epoch(t, 1020, wait_share=0.8, workers_cpu_share=0.5)
    assert t.log[-1]["kept"] is False and t.log[-1]["measured_items_per_s"] == 1020


def test_a_noisy_epoch_does_not_revert_a_change_the_next_one_shows_faster() -> None:
    t = _tuner()
    _epoch(t, 1000, wait_share=0.8, workers_cpu_share=1.0)
    _epoch(t, 900, wait_share=0.8, workers_cpu_share=0.5)  # -10%: within a shared host's noise
    assert t.log == []
    _epoch(t, 1300, wait_share=0.6, workers_cpu_share=0.9)  # both epochs together: 1,100 items/s
    assert t.log[-1]["kept"] is True and t.log[-1]["measured_items_per_s"] == 1100
    assert t.loader.num_workers == 2


def test_nothing_changes_when_the_trainer_binds() -> None:
    t = _tuner()
    for _ in range(3):
        _epoch(t, 1000, wait_share=0.01, workers_cpu_share=0.3)
    assert t.log == [] and t.pending is None and t.loader.num_workers == 1


def test_workers_that_wait_on_storage_get_more_items_in_flight() -> None:
    t = _tuner()
    _epoch(t, 300, wait_share=0.9, workers_cpu_share=0.05)
    assert t.trial is not None and t.trial["knob"] in ("num_workers=2", "prefetch_factor=4")


def test_a_short_epoch_is_not_judged_alone() -> None:
    t = _tuner()
    _epoch(t, 1000, wait_share=0.8, workers_cpu_share=1.0)
    _epoch(t, 100, wait_share=0.8, workers_cpu_share=1.0)  # under min_items: judged with the next epoch
    assert t.log == [] and t.trial is not None
    _epoch(t, 2900, wait_share=0.6, workers_cpu_share=1.0)  # 3,000 items in 2 s
    assert t.log[-1]["kept"] is True and t.log[-1]["measured_items_per_s"] == 1500


def _threads_tuner(threads: int) -> Tuner:
    torch.set_num_threads(threads)
    inner = SimpleNamespace(_iterator=None, num_workers=1, prefetch_factor=2)
    loader = SimpleNamespace(num_workers=1, prefetch_factor=2, batch_size=32, _torch=inner, _watch=None)
    return Tuner(loader, TuneOptions())


def test_one_intra_op_thread_is_tried_first_when_threads_and_workers_outnumber_the_cores() -> None:
    """2 cores, 2 intra-op threads and 1 worker: the main process uses under one core (its threads wait for
    the cores rather than add CPU), so the model predicts nothing from one thread; the tuner tries it
    anyway, before more workers, at the rate measured, and keeps it on what the next epoch measures."""
    try:
        t = _threads_tuner(2)
        t.options = TuneOptions(knobs=("intra_op_threads",))  # one knob: no joined step
        _epoch(t, 400, wait_share=0.8, workers_cpu_share=0.9, main_cpu_s=0.6, cores=2)
        assert t.trial is not None and t.trial["knob"] == "intra_op_threads=1", t.trial
        assert t.trial["predicted_items_per_s"] == 400  # a trial: the model has no term for the contention
        _epoch(t, 800, wait_share=0.5, workers_cpu_share=1.0, main_cpu_s=0.6, cores=2)
        assert t.log[-1]["kept"] is True and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(THREADS)


def test_one_intra_op_thread_is_tried_when_the_steps_threads_wait_for_the_cores() -> None:
    """The README job on the loaded 2-core VM: 2 threads, 1 worker, the loop waits on the loader 3% of the
    time (no data stall), its main process on 0.25 cores: one thread is a trial (it measured 2.4x)."""
    try:
        t = _threads_tuner(2)
        _epoch(t, 300, wait_share=0.03, workers_cpu_share=0.12, main_cpu_s=0.25, cores=2)
        assert t.trial is not None and t.trial["knob"] == "intra_op_threads=1"
    finally:
        torch.set_num_threads(THREADS)


def test_the_trainer_threads_are_left_alone_when_the_cores_hold_them_and_the_workers() -> None:
    try:
        t = _threads_tuner(2)  # 2 threads + 1 worker on 4 cores; the main process under one core
        _epoch(t, 400, wait_share=0.8, workers_cpu_share=1.0, main_cpu_s=0.6, cores=4)
        assert t.trial is not None and t.trial["knob"] == "num_workers=2"
        # 2 threads + 1 worker on 2 cores, but the loop does not wait and its step waits on an accelerator
        # (the main process on 0.02 cores): the threads take no core from anyone
        t = _threads_tuner(2)
        _epoch(t, 400, wait_share=0.01, workers_cpu_share=0.3, main_cpu_s=0.02, cores=2)
        assert t.trial is None and t.pending is None
    finally:
        torch.set_num_threads(THREADS)


def test_every_promising_change_is_tried_at_once_then_one_at_a_time_if_that_measured_worse() -> None:
    """2 cores, 2 intra-op threads, 1 worker: one thread (a trial) and a second worker (predicted) together
    first, the model's best point in one epoch; reverted, they come one at a time, the thread first."""
    try:
        t = _threads_tuner(2)
        _epoch(t, 400, wait_share=0.8, workers_cpu_share=0.9, main_cpu_s=0.6, cores=2)
        assert t.trial is not None and t.trial["knob"] == "intra_op_threads=1+num_workers=2", t.trial
        assert t.pending == Knobs(2, 2, 1)
        _epoch(t, 300, wait_share=0.8, workers_cpu_share=0.5, main_cpu_s=0.6, cores=2)  # -25%: reverted
        assert t.log[-1]["kept"] is False and t.pending == Knobs(1, 2, 2)
        _epoch(t, 400, wait_share=0.8, workers_cpu_share=0.9, main_cpu_s=0.6, cores=2)
        assert t.trial is not None and t.trial["knob"] == "intra_op_threads=1"
        _epoch(t, 800, wait_share=0.5, workers_cpu_share=1.0, main_cpu_s=0.6, cores=2)
        assert t.log[-1]["kept"] is True and torch.get_num_threads() == 1
        assert t.trial is not None and t.trial["knob"] == "num_workers=2"  # then the workers, one thread on
    finally:
        torch.set_num_threads(THREADS)


def test_threads_are_left_alone_while_the_host_leaves_cores_idle() -> None:
    """Workers that wait 5 ms per read, 2 threads and 2 workers on 2 cores, a core and a half idle: nothing
    waits for a core, so no thread trial; more workers (one read in flight each) instead."""
    try:
        t = _threads_tuner(2)
        t.loader.num_workers = t.loader._torch.num_workers = 2
        t.tried.clear()
        _epoch(t, 360, wait_share=0.9, workers_cpu_share=0.05, main_cpu_s=0.3, cores=2, idle_cores=1.5)
        assert t.trial is not None and t.trial["knob"] == "num_workers=4", t.trial
    finally:
        torch.set_num_threads(THREADS)

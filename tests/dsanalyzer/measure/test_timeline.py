"""The timeline recorder and the stall arithmetic of the differential method."""

from __future__ import annotations

import math

import pytest

from dsanalyzer.measure.stalls import bound_of, differential, epoch_start, per_epoch
from dsanalyzer.measure.timeline import Timeline, block_median, summarize


def test_timeline_attributes_wait_and_step_at_the_iterator_boundary(monkeypatch):
    clock = iter([0.0, 0.3, 1.3, 1.5, 2.5, 2.6, 3.6])  # start/end of __next__, alternately
    monkeypatch.setattr("dsanalyzer.measure.timeline.time.perf_counter", lambda: next(clock))
    tl = Timeline()
    for _ in range(3):
        tl.next_started()
        tl.next_ended(8)
    tl.next_started()  # the call after the last batch closes its step
    assert tl.wait_s == pytest.approx([0.3, 0.2, 0.1])
    assert tl.step_s == pytest.approx([1.0, 1.0, 1.0])
    assert tl.batch_items == [8, 8, 8]
    assert tl.complete_iterations == 3


def test_end_of_epoch_is_not_a_batch():
    tl = Timeline()
    tl.next_started()
    tl.abandon_pending()  # StopIteration
    tl.next_started()
    tl.next_ended(4)
    assert len(tl.wait_s) == 1 and tl.step_s == []


def test_an_epochs_first_batch_waits_from_iter_and_is_marked(monkeypatch):
    # iter() at 10.0 took 0.25 s (new workers); its first __next__ starts at 10.25 and returns at 10.4.
    clock = iter([0.0, 0.1, 1.1, 1.2, 2.2, 10.25, 10.4, 11.4, 11.5])
    monkeypatch.setattr("dsanalyzer.measure.timeline.time.perf_counter", lambda: next(clock))
    tl = Timeline()
    tl.iterator_opened(-0.05)
    tl.next_started()
    tl.next_ended(4)
    tl.next_started()
    tl.next_ended(4)
    tl.next_started()  # the call that raises StopIteration: the second batch's step ends here
    tl.abandon_pending()
    tl.iterator_opened(10.0)
    tl.next_started()
    tl.next_ended(4)
    tl.next_started()
    tl.next_ended(4)
    assert tl.epoch_starts == [0, 2]
    assert tl.wait_s == pytest.approx([0.15, 0.1, 0.4, 0.1])  # the new epoch's wait includes iter()
    assert tl.step_s == pytest.approx([1.0, 1.0, 1.0])  # the gap before iter() (2.2 to 10.0) is the script's
    assert tl.starts[0] == pytest.approx(0.0) and tl.starts[2] == pytest.approx(10.05)


def test_epoch_start_is_the_first_batches_excess_over_a_steady_wait():
    waits = [0.5, 0.01, 0.02] + [0.09, 0.01, 0.03, 0.01, 0.03] * 4
    got = epoch_start(waits, [0, 3, 8, 13, 18], warmup=2)
    assert got["epochs"] == 4  # the first epoch's start is warm-up
    assert got["typical_wait_s"] == pytest.approx(0.02)
    assert got["s_per_epoch"] == pytest.approx(0.07)
    assert epoch_start(waits, [0], warmup=2) is None  # no epoch began after warm-up
    assert epoch_start([0.01] * 10, [0, 5], warmup=1)["s_per_epoch"] == 0.0  # never negative
    # two workers on slow storage alternate long and short waits: the steady cost is their mean
    bursty = epoch_start([0.5] + [0.64, 0.14] * 5 + [0.79] + [0.64, 0.14] * 5, [0, 11], warmup=1)
    assert bursty["typical_wait_s"] == pytest.approx(0.39) and bursty["s_per_epoch"] == pytest.approx(0.40)


def test_an_epochs_first_round_is_one_batch_per_worker():
    # Two workers in step: every second batch waits ~1 ms; an epoch's first round waits 97 + 1 ms where
    # two steady batches wait 64 + 1 ms. The first batch's excess alone (65 ms) counted the fill twice.
    epoch = [0.097, 0.001] + [0.064, 0.001] * 15
    waits = epoch * 3
    firsts = [0, 32, 64]
    alone = epoch_start(waits, firsts, warmup=2, workers=1)
    pair = epoch_start(waits, firsts, warmup=2, workers=2)
    assert alone["s_per_epoch"] == pytest.approx(0.097 - 0.0325, abs=2e-3)
    assert pair["first_round"] == 2 and pair["typical_wait_s"] == pytest.approx(0.0325)
    assert pair["s_per_epoch"] == pytest.approx(0.098 - 2 * 0.0325)  # 33 ms
    assert pair["first_round_wait_s"] == pytest.approx(0.098) and pair["first_wait_s"] == pytest.approx(0.097)
    # a round stops at the next epoch's first batch (epochs shorter than the workers) and at the end
    short = epoch_start([0.1, 0.2, 0.3, 0.5, 0.05, 0.3, 0.05], [0, 3, 5], warmup=1, workers=4)
    assert short["epochs"] == 2 and short["typical_wait_s"] == pytest.approx(0.25)  # batches 1 and 2 left
    assert short["first_round_wait_s"] == pytest.approx((0.55 + 0.35) / 2)  # rounds of 2: 3-4 and 5-6
    assert short["s_per_epoch"] == 0.0  # (0.05 - 0.15) / 2: never negative


def test_sync_is_called_before_each_boundary_timestamp():
    calls = []
    tl = Timeline(sync=lambda: calls.append(1))
    tl.next_started()
    tl.next_ended(1)
    tl.next_started()
    assert len(calls) == 2


def test_summarize_drops_warmup_and_reports_spread():
    waits = [5.0] * 3 + [0.1] * 40  # slow warm-up iterations are dropped
    steps = [1.0] * 43
    s = summarize(waits, steps, [10] * 43, warmup=3)
    assert s.iters == 40
    assert s.wait_s == pytest.approx(0.1)
    assert s.iter_s == pytest.approx(1.1)
    assert s.samples_per_s == pytest.approx(10 / 1.1)
    assert s.spread_s["wait"]["p10"] == pytest.approx(0.1)


def test_bursty_waits_are_not_hidden_by_the_median():
    # two workers: every other batch waits 0.2 s, the rest are ready. A plain median says 0.
    waits = [0.0, 0.2] * 40
    s = summarize(waits, [0.1] * 80, [1] * 80, warmup=0)
    assert s.wait_s == pytest.approx(0.1)
    assert block_median([1.0, 3.0] * 20) == pytest.approx(2.0)


def test_summarize_without_batches_is_a_clear_error():
    with pytest.raises(ValueError, match="yielded no batches"):
        summarize([], [], [], warmup=5)


def _run(iter_s: float):
    n = 40
    return summarize([0.0] * n, [iter_s] * n, [8] * n, warmup=0)


def test_differential_stalls_are_differences_of_whole_iterations():
    d = differential(_run(0.050), _run(0.080), _run(0.125))
    assert d["per_iter_s"]["compute"] == pytest.approx(0.050)
    assert d["per_iter_s"]["prep_stall"] == pytest.approx(0.030)
    # fetch stall = T4 - T2 (not T4 - (T2 - T1): no compute time leaks in)
    assert d["per_iter_s"]["fetch_stall"] == pytest.approx(0.045)


def test_differential_clips_noise_below_zero():
    d = differential(_run(0.050), _run(0.049), _run(0.048))
    assert d["per_iter_s"]["prep_stall"] == 0.0 and d["per_iter_s"]["fetch_stall"] == 0.0


@pytest.mark.parametrize(
    ("prep", "fetch", "bound"),
    [(0.001, 0.001, "compute"), (0.03, 0.01, "prep"), (0.01, 0.03, "fetch"), (0.0, 0.0, "compute")],
)
def test_bound_is_the_largest_stall_unless_both_are_small(prep, fetch, bound):
    assert bound_of({"compute": 0.05, "prep_stall": prep, "fetch_stall": fetch}) == bound


def test_per_epoch_scales_by_iterations_with_a_partial_last_batch():
    e = per_epoch({"compute": 0.1, "prep_stall": 0.02, "fetch_stall": 0.0}, items=1001, batch_size=100)
    assert e["iters"] == 11
    assert e["compute"] == pytest.approx(1.1)
    assert e["total"] == pytest.approx(1.32)
    assert not math.isnan(e["total"])

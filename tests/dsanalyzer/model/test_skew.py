"""The in-order loss of skewed per-sample prep times: torch's batch dispatch replayed, seeded."""

from __future__ import annotations

import numpy as np
import pytest

from dsanalyzer.model.skew import handout_seconds, in_order_loss, spread_summary

HEAVY = [0.001] * 56 + [0.1] * 8  # one sample in 8 costs 100x the rest


def test_equal_batches_are_handed_out_at_the_work_conserving_bound_either_way():
    costs = [0.01] * 40
    for in_order in (True, False):
        assert handout_seconds(costs, workers=4, in_order=in_order) == pytest.approx(40 * 0.01 / 4)


def test_a_slow_batch_holds_up_the_ready_ones_only_in_order():
    costs = [1.0] + [0.1] * 19  # worker 0 gets the slow one first
    ordered = handout_seconds(costs, workers=2, prefetch=2, in_order=True)
    any_order = handout_seconds(costs, workers=2, prefetch=2, in_order=False)
    assert any_order < ordered
    assert any_order >= sum(costs) / 2  # never past the bound


def test_uniform_prep_times_lose_about_nothing():
    const = in_order_loss([0.001] * 64, batch=64, workers=8)
    assert const["loss"] == 0.0 and const["gain"] == 0.0
    narrow = in_order_loss(np.linspace(0.9e-3, 1.1e-3, 64), batch=16, workers=16)
    assert narrow["loss"] < 0.01


def test_a_heavy_tail_with_small_batches_and_many_workers_loses_more():
    big_batches = in_order_loss(HEAVY, batch=64, workers=2)["loss"]
    small_batches = in_order_loss(HEAVY, batch=4, workers=16)["loss"]
    assert small_batches >= 0.2 and small_batches > 2 * big_batches
    r = in_order_loss(HEAVY, batch=4, workers=16)
    assert r["gain"] == pytest.approx(r["loss"] / (1 - r["loss"]))


def test_the_replay_is_seeded_and_one_worker_loses_nothing():
    assert in_order_loss(HEAVY, 8, 4, seed=3) == in_order_loss(HEAVY, 8, 4, seed=3)
    assert in_order_loss(HEAVY, 8, 4, seed=3)["loss"] != in_order_loss(HEAVY, 8, 4, seed=4)["loss"]
    assert in_order_loss(HEAVY, 4, workers=1)["loss"] == 0.0
    assert in_order_loss(HEAVY, 4, workers=0)["loss"] == 0.0
    with pytest.raises(ValueError, match="batch"):
        in_order_loss(HEAVY, 0, 4)


def test_spread_summary_fields():
    s = spread_summary(HEAVY)
    assert s["n"] == 64 and s["p50_s"] == pytest.approx(0.001) and s["max_s"] == pytest.approx(0.1)
    assert s["p90_s"] <= s["p99_s"] <= s["max_s"] and s["p99_over_p50"] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="no sample times"):
        spread_summary([])

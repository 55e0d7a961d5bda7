"""Planner decisions from fitted lines, MG-WFBP merging and PTO partitioning (no processes needed)."""

from __future__ import annotations

import pytest
import torch

from gradcomp.planner import Line, Planner, fit_line, mgwfbp_merge, suggest_bucket_cap_mb
from gradcomp.pto import partition_by_size


def test_fit_line_recovers_slope_and_intercept() -> None:
    line = fit_line([1, 2, 4], [1.5, 2.0, 3.0])
    assert line.a == pytest.approx(1.0) and line.b == pytest.approx(0.5)


def test_fast_link_keeps_everything_dense() -> None:
    # 25 Gbit/s-class link: 4 bytes/elem all-reduced faster than any encoder runs.
    dense = Line(50e-6, 4 * 2 / 3e9)
    planner = Planner(dense=dense, sync=Line(200e-6, 3e-9), encode=Line(50e-6, 2.5e-9))
    assert not any(planner.decide(n).compress for n in (1_000, 100_000, 10_000_000))


def test_slow_link_compresses_large_buckets_but_not_small_ones() -> None:
    dense = Line(1e-3, 4 * 2 / 12.5e6)  # 100 Mbit/s
    planner = Planner(dense=dense, sync=Line(2e-3, 5e-9), encode=Line(0.2e-3, 3e-9))
    assert planner.decide(10_000_000).compress
    assert not planner.decide(100).compress


def test_partitions_are_chosen_when_encode_and_comm_are_both_large() -> None:
    planner = Planner(dense=Line(1e-3, 1e-7), sync=Line(1e-4, 4e-8), encode=Line(1e-5, 2e-8))
    d = planner.decide(10_000_000)
    assert d.compress and d.partitions > 1
    assert d.predicted_comp_s < planner.predict(10_000_000, 1)


def test_mgwfbp_merges_layers_that_arrive_within_a_startup_latency() -> None:
    # Three tiny layers ready 1 us apart with a 1 ms start-up latency: one group.
    assert mgwfbp_merge([100, 100, 100], [1e-6] * 3, 1e-3, 1e-9) == [[0, 1, 2]]
    # Layers far apart in time relative to alpha: each goes on its own.
    assert mgwfbp_merge([100, 100], [1.0, 1.0], 1e-6, 1e-12) == [[0], [1]]


def test_suggest_bucket_cap_is_at_least_one_mb() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 2))
    assert suggest_bucket_cap_mb(model, 1e-3, 1e-9, 0.01) >= 1.0


def test_partition_by_size_balances_and_is_deterministic() -> None:
    owner = partition_by_size([100, 10, 90, 5, 5], 2)
    load = [sum(n for n, o in zip([100, 10, 90, 5, 5], owner, strict=True) if o == r) for r in range(2)]
    assert max(load) - min(load) <= 10
    assert owner == partition_by_size([100, 10, 90, 5, 5], 2)


def test_one_partition_predicts_the_measured_sync_even_when_encode_fit_is_noisier() -> None:
    # Encode-only fit above the full sync fit (measurement noise): K=1 must still predict sync(n).
    planner = Planner(dense=Line(1e-3, 29e-9), sync=Line(4e-3, 21e-9), encode=Line(0.4e-3, 38e-9))
    assert planner.predict(6_000_000, 1) == pytest.approx(4e-3 + 21e-9 * 6_000_000)
    assert planner.decide(6_000_000).compress


def test_a_predicted_gain_below_the_noise_floor_stays_dense() -> None:
    # 30 % faster on paper, but only 0.3 ms: not evidence enough on a loaded machine.
    planner = Planner(dense=Line(0.0, 100e-9), sync=Line(0.0, 70e-9), encode=Line(0.0, 10e-9))
    assert not planner.decide(10_000).compress
    assert planner.decide(1_000_000).compress

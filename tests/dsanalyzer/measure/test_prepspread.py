"""The profile's per-sample prep spread: seeded items over the dataset, CPU-timed, bounded, side-effect free."""

from __future__ import annotations

import random
import time

import numpy as np
import torch

from dsanalyzer.measure.prepspread import measure_prep_spread


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_slow_tenth_of_the_items_shows_in_the_tail_not_the_median():
    def prep(raw, i):
        _burn(0.004 if i % 10 == 0 else 0.0002)
        return raw

    out = measure_prep_spread(1000, prep, count=40, budget_s=10.0)
    assert out["n"] == 40 and len(out["cpu_s"]) == 40
    assert out["p50_s"] < 0.002 and out["max_s"] >= 0.004
    assert out["p99_over_p50"] > 3


def test_seeded_indices_spread_over_the_dataset_with_fetch_untimed():
    seen: list[int] = []

    def fetch(i):
        seen.append(i)
        _burn(0.003)  # a read: not prep
        return i

    out = measure_prep_spread(10_000, lambda raw, i: raw, fetch=fetch, count=20)
    assert len(set(seen)) == 21 and max(seen) - min(seen) > 2000  # 20 timed + 1 warm, spread out
    assert out["max_s"] < 0.002
    again: list[int] = []
    measure_prep_spread(10_000, lambda raw, i: again.append(i), count=20)
    assert again[:21] == seen[:21]  # the same items in the same order (then any outliers timed again)


def test_the_job_random_state_and_threads_are_left_as_they_were():
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    threads = torch.get_num_threads()
    expected = (torch.rand(1).item(), random.random(), np.random.random())
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    measure_prep_spread(100, lambda raw, i: (torch.rand(3), random.random(), np.random.random()), count=8)
    assert (torch.rand(1).item(), random.random(), np.random.random()) == expected
    assert torch.get_num_threads() == threads


def test_it_stops_at_its_budget_and_a_failing_item_is_named():
    out = measure_prep_spread(1000, lambda raw, i: _burn(0.05), count=64, budget_s=0.2)
    assert 1 <= out["n"] <= 4  # each item takes at least its 50 ms of CPU in wall time: 0.2 s holds 4

    def prep(raw, i):
        if i == 7:
            raise OSError("truncated file")

    out = measure_prep_spread(8, prep, count=64)
    assert out == {"error": "item 7 failed: OSError: truncated file"}
    assert measure_prep_spread(0, prep) == {"error": "the dataset has no items"}


def test_a_one_off_cost_is_timed_again_and_not_taken_for_skew():
    seen: set[int] = set()

    def prep(raw, i):
        _burn(0.0005 if i in seen or len(seen) != 5 else 0.05)  # the 6th item's first prep: a one-off
        seen.add(i)

    out = measure_prep_spread(1000, prep, count=30, budget_s=10.0)
    assert out["retimed"] >= 1 and out["max_s"] < 0.02

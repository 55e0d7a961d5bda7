"""Cache-hit models: the LRU closed form against a simulated LRU, MinIO against its simulation."""

from __future__ import annotations

import pytest

from dsanalyzer.model.cache import (
    cached_fraction_for_hit_ratio,
    hit_ratio,
    lru_hit_ratio,
    minio_hit_ratio,
    simulate_lru_hit_ratio,
    simulate_minio_hit_ratio,
)


@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.5, 0.7, 0.9])
def test_lru_closed_form_matches_simulation(fraction):
    n = 3000
    simulated = simulate_lru_hit_ratio(int(fraction * n), n, epochs=4, seed=7)
    assert lru_hit_ratio(fraction * n, n) == pytest.approx(simulated, abs=0.012)


@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.8])
def test_minio_is_the_cached_fraction(fraction):
    n = 2000
    assert simulate_minio_hit_ratio(int(fraction * n), n) == pytest.approx(fraction, abs=1e-9)
    assert minio_hit_ratio(fraction * n, n) == pytest.approx(fraction)


def test_page_cache_thrashes_below_the_cached_fraction():
    for fraction in (0.25, 0.5, 0.75, 0.95):
        assert lru_hit_ratio(fraction, 1.0) < fraction
    assert lru_hit_ratio(0.5, 1.0) == pytest.approx(0.1534, abs=1e-3)


def test_edges_and_whole_dataset():
    assert lru_hit_ratio(0, 100) == 0.0
    assert lru_hit_ratio(100, 100) == 1.0 and lru_hit_ratio(500, 100) == 1.0
    assert minio_hit_ratio(500, 100) == 1.0
    assert simulate_lru_hit_ratio(100, 100) == 1.0


def test_inverse_gives_the_fraction_needed():
    for target in (0.1, 0.5, 0.9):
        c = cached_fraction_for_hit_ratio("pagecache", target)
        assert lru_hit_ratio(c, 1.0) == pytest.approx(target, abs=1e-9)
        assert cached_fraction_for_hit_ratio("minio", target) == target


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="unknown cache policy 'lfu'"):
        hit_ratio("lfu", 1, 10)
    with pytest.raises(ValueError, match="dataset_items"):
        lru_hit_ratio(1, 0)
    with pytest.raises(ValueError, match="cache size"):
        minio_hit_ratio(-1, 10)

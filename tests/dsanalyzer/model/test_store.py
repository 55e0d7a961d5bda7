"""An object store's fetch model (dsanalyzer.model.store) and the what-if model over a bucket."""

from __future__ import annotations

import pytest

from dsanalyzer.judge.verdict import recommend, verdict
from dsanalyzer.model.store import StoreModel, fit, loader_concurrency, store_fields
from dsanalyzer.model.whatif import Model
from tests.dsanalyzer.model.test_whatif import synthetic_report

# 20 ms round trip, one stream 50 MB/s, the store at most 400 requests/s and 12.5 MB/s (a 100 Mbit/s link)
STORE = StoreModel(latency_s=0.02, stream_bytes_per_s=50e6, request_rate=400.0, bandwidth_bytes_per_s=12.5e6)
ITEM = 100_000.0


def probe_points(store: StoreModel, top: int) -> list[dict]:
    """What a noiseless probe would measure: tiny ranges and whole objects, alone and ``top`` at once."""
    points = []
    for c in (1, top):
        for nbytes in (1.0, ITEM):
            rps = store.requests_per_s(c, nbytes)
            points.append(
                {"concurrency": c, "request_bytes": nbytes, "requests_per_s": rps, "latency_s": c / rps}
            )
    return points


def test_fit_recovers_a_store_whose_ceilings_the_probe_reached():
    got = fit(probe_points(STORE, top=32), ITEM)
    assert got.latency_s == pytest.approx(STORE.latency_s)
    assert got.stream_bytes_per_s == pytest.approx(STORE.stream_bytes_per_s)
    assert got.request_rate == pytest.approx(STORE.request_rate)
    assert got.bandwidth_bytes_per_s == pytest.approx(STORE.bandwidth_bytes_per_s)
    assert not got.request_rate_is_lower_bound and not got.bandwidth_is_lower_bound


def test_a_ceiling_the_probe_did_not_reach_is_a_lower_bound():
    got = fit(probe_points(STORE, top=2), ITEM)  # 2 in flight: still latency-bound
    assert got.request_rate_is_lower_bound and got.bandwidth_is_lower_bound
    assert got.request_rate <= STORE.request_rate


def test_fit_names_a_missing_probe_point():
    with pytest.raises(ValueError, match="concurrency 1"):
        fit(probe_points(STORE, top=8)[2:], ITEM)


def test_latency_bound_rate_grows_with_concurrency_until_the_bytes_bind():
    one = STORE.items_per_s(1, ITEM)
    assert one == pytest.approx(1 / (0.02 + ITEM / 50e6))
    assert STORE.items_per_s(2, ITEM) == pytest.approx(2 * one)
    assert STORE.bound(1, ITEM) == "latency"
    many = STORE.items_per_s(64, ITEM)
    assert many == pytest.approx(12.5e6 / ITEM)  # the link's bytes
    assert STORE.bound(64, ITEM) == "bytes"


def test_shards_help_a_request_bound_store_and_not_a_bytes_bound_one():
    small = 2_000.0  # 2 kB objects: the request rate binds
    assert STORE.bound(64, small) == "requests"
    loose, shards = STORE.items_per_s(64, small), STORE.items_per_s(64, small, items_per_request=100)
    assert shards > 10 * loose  # until the link's bytes bind: 2 kB x 100 at 12.5 MB/s
    big = STORE.items_per_s(64, ITEM, items_per_request=100)
    assert big == pytest.approx(STORE.bandwidth_bytes_per_s / ITEM, rel=0.01)  # bytes-bound either way


def test_loader_concurrency_is_workers_times_read_ahead():
    assert loader_concurrency(2, 4) == 8
    assert loader_concurrency(2, 0) == 2  # torch's loader: each worker one request at a time
    assert loader_concurrency(0, 4) == 1  # the main process reads one item at a time


def bucket_report(fetch_ahead: int = 1, workers: int = 2, **over) -> dict:
    rep = synthetic_report(**over)
    rep.update(cache_policy="minio", cache_bytes=0, workers=workers)
    rep["source"] = {
        "kind": "bucket",
        "url": "s3://data/train",
        "fetch_ahead": fetch_ahead,
        "items_per_request": 1.0,
        "model": STORE.params(),
    }
    return rep


def test_the_model_reads_the_store_from_the_report():
    model = Model.from_report(bucket_report(fetch_ahead=2))
    assert model.store == STORE and model.fetch_ahead == 2
    assert model.storage_bytes_per_s == STORE.bandwidth_bytes_per_s
    bad = bucket_report()
    del bad["source"]["model"]
    with pytest.raises(ValueError, match="source.model"):
        Model.from_report(bad)
    assert store_fields(synthetic_report()) == {}  # files: no store


def test_the_fetch_stage_is_the_stores_rate_at_the_loaders_concurrency_and_a_cache_divides_the_misses():
    model = Model.from_report(bucket_report(fetch_ahead=2))
    p = model.predict_measured()
    assert p.stage_rates["fetch"] == pytest.approx(STORE.items_per_s(4, ITEM))
    half = model.predict(model.dataset_bytes / 2, model.cpus, model.storage_bytes_per_s, policy="minio")
    assert half.stage_rates["fetch"] == pytest.approx(
        2 * p.stage_rates["fetch"], rel=3e-3
    )  # hits: a memory copy
    more = model.predict(0, model.cpus, model.storage_bytes_per_s, policy="minio", fetch_ahead=8)
    assert more.stage_rates["fetch"] == pytest.approx(STORE.items_per_s(16, ITEM))
    shards = model.predict(0, model.cpus, model.storage_bytes_per_s, policy="minio", items_per_request=50)
    assert shards.stage_rates["fetch"] == pytest.approx(STORE.items_per_s(4, ITEM, 50))


def test_without_read_ahead_each_worker_waits_its_own_round_trip():
    model = Model.from_report(bucket_report(fetch_ahead=0))
    p = model.predict_measured()
    own = STORE.request_s(ITEM)
    prep = model.prep.rate(2)
    assert p.stage_rates["worker_cycle"] == pytest.approx(min(p.stage_rates["cpu"], 2 / (own + 2 / prep)))


def test_a_latency_bound_bucket_job_is_told_to_read_ahead_first():
    rep = bucket_report(fetch_ahead=1, rates_per_s={"compute": 800.0, "prep": 2000.0, "fetch": 20.0, "observed": 20.0},
                        prep_scaling={"workers": [1, 2], "samples_per_s": [1000.0, 2000.0]})  # fmt: skip
    rep["dataset"] = {"items": 10_000, "bytes": 1e8, "avg_item_bytes": 1e4, "path": "s3://data/train"}
    model = Model.from_report(rep)
    fix = recommend(model)
    assert fix is not None and fix["change"]["fetch_ahead"] > 1
    ahead = fix["change"]["fetch_ahead"]
    assert model.predict(0, 2, model.storage_bytes_per_s, policy="minio", fetch_ahead=ahead).samples_per_s > (
        model.predict_measured().samples_per_s * 2
    )
    assert "coordl.DataLoader(" in verdict(rep)["fix"]["code"]
    assert "a bucket: 20.0 ms round trip" in verdict(rep)["sentence"]

"""Finding the bucket a dataset reads, and probing it (dsanalyzer.measure.objectstore) against a real S3 server."""

from __future__ import annotations

import pytest

import coordl
from dsanalyzer.measure.objectstore import bucket_section, find_bucket
from tests.support.s3server import S3Server, s3server_missing_reason


class PlainUrls:
    """A user's dataset that lists its objects as URLs (and reads them itself)."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls

    def __len__(self) -> int:
        return len(self.urls)


def test_a_dataset_listing_s3_urls_is_a_bucket():
    ds = PlainUrls([f"s3://data/train/c{i % 2}/{i}.jpg" for i in range(6)])
    found = find_bucket(ds)
    assert found is not None and (found.bucket, found.prefix) == ("data", "train")
    assert found.keys[0] == "train/c0/0.jpg" and len(found.keys) == 6


def test_local_files_are_no_bucket(tmp_path):
    (tmp_path / "a.jpg").write_bytes(b"x")
    assert find_bucket(PlainUrls([str(tmp_path / "a.jpg")])) is None
    assert find_bucket(None) is None


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    reason = s3server_missing_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("objs")
    for i in range(40):
        (root / f"c{i % 2}").mkdir(exist_ok=True)
        (root / f"c{i % 2}" / f"{i:03d}.jpg").write_bytes(bytes([i]) * 20_000)
    with S3Server(delay_ms=5, auth=False) as srv:  # 10 ms round trip through the delay proxy
        srv.create_bucket("data")
        srv.upload_dir(root, "data", "train")
        yield srv


def test_a_coordl_bucket_dataset_is_found_with_its_store_and_listing(bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("COORDL_CACHE_DIR", str(tmp_path))
    ds = coordl.ImageFolder(
        "s3://data/train", transform=lambda b: b, storage_options=bucket.storage_options()
    )
    loader = coordl.DataLoader(ds, batch_size=4, num_workers=0)
    found = find_bucket(loader.dataset, loader.source)
    assert found is not None and found.prefix == "train" and len(found.keys) == 40
    assert found.store is not None and found.sizes[found.keys[0]] == 20_000  # the listing's sizes, no GET
    section = bucket_section(found, loader_concurrency=2, fetch_ahead=1, workers=2, budget_s=0.4)
    assert section["kind"] == "bucket" and section["url"] == "s3://data/train"
    assert section["endpoint"] == bucket.endpoint and section["objects"] == 40
    assert section["mean_object_bytes"] == 20_000 and section["size_method"] == "the bucket's listing"
    model, check = section["model"], section["check"]
    # The delay proxy holds every request at least 2 x 5 ms: the fitted round trip cannot be shorter.
    assert model["latency_s"] >= 0.010
    assert {p["concurrency"] for p in section["points"]} >= {1, 2, 8}
    assert check["concurrency"] == 2 and check["measured_items_per_s"] > 0
    assert (
        section["fetch"]["threads"] == 2 and section["fetch"]["items_per_s"] == check["measured_items_per_s"]
    )
    assert ds.stats()["store_requests"] >= sum(p["requests"] for p in section["points"])  # its own store


def test_a_bucket_staged_to_local_disk_is_profiled_as_its_files_are(bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("COORDL_CACHE_DIR", str(tmp_path))
    ds = coordl.ImageFolder("s3://data/train", transform=lambda b: b, storage_options=bucket.storage_options(),
                            stage_dir=str(tmp_path / "stage"))  # fmt: skip
    assert ds.describe(0).startswith(
        "s3://"
    )  # it names the bucket, yet reads local copies after the first read
    assert find_bucket(ds) is None


def test_a_store_that_cannot_be_reached_leaves_a_note(bucket):
    found = find_bucket(PlainUrls(["s3://no-such-bucket/a/b.jpg"]))
    from coordl.objectstore import ObjectStore

    found.store = ObjectStore("s3://no-such-bucket", bucket.storage_options(), attempts=1)
    section = bucket_section(found, 1, 0, 1, budget_s=0.2)
    assert "probe_error" in section and "no-such-bucket" in section["probe_error"]
    assert "model" not in section


def test_a_dataset_that_gets_its_objects_itself_has_its_round_trips_taken_out_of_prep():
    from dsanalyzer.measure.objectstore import prep_without_fetch
    from dsanalyzer.model.store import StoreModel

    store = StoreModel(
        latency_s=0.025, stream_bytes_per_s=1e15, request_rate=1000.0, bandwidth_bytes_per_s=1e9
    )
    prep = {1: 400.0, 2: 700.0}  # what the workers' CPU alone would do
    # each worker: one round trip, then its prep; what a loader-alone run of such a dataset measures
    measured = [k / (0.025 + k / p) for k, p in prep.items()]
    scaling = {"workers": [1, 2], "samples_per_s": measured, "cpu_share": [0.05, 0.09]}
    got = prep_without_fetch(scaling, {"model": store.params(), "mean_object_bytes": 2000.0})
    assert got["samples_per_s"] == pytest.approx(list(prep.values()))
    assert got["samples_per_s_with_fetch"] == measured and got["cpu_share"] == [None, None]
    assert "25.0 ms" in got["fetch_subtracted"]

"""`dsanalyzer profile` and `verify` on a job that streams from a bucket (a real S3 server behind a delay proxy).

The job (tests/dsanalyzer/bucket_job.py) reads ``coordl.ImageFolder("s3://data/train")`` with 2 workers and one
read-ahead thread each: with a 20 ms round trip it is fetch-bound on the store's latency. The report must name
the bucket, its fitted rates must reproduce what the probe measured at the loader's concurrency, the model must
agree with the real run, and verify of a change (a MinIO cache of half the dataset) must land near the
what-if's prediction.

Thresholds come from the runs' own measured spread: the probe's rate over windows of its run, the real run's
block rates (the verdict's ``spread``), and verify's ``TARGET_ERROR`` widened by the same spread when the
machine is noisy.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from coordl.datasets.synth import make_dataset
from dsanalyzer.judge.verify import TARGET_ERROR
from dsanalyzer.profiler import profile_command
from dsanalyzer.report.text import summary_text
from dsanalyzer.verify import verify_command
from tests.support.s3server import S3Server, s3server_missing_reason

JOB = Path(__file__).with_name("bucket_job.py")


def _job(url: str, **args) -> list[str]:
    cmd = [sys.executable, str(JOB), "--url", url]
    for k, v in args.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    return cmd


@pytest.mark.slow
@pytest.mark.exclusive  # measures against a target: runs alone (scripts/test.sh)
def test_profile_names_the_bucket_models_its_rate_and_verify_checks_a_cache(tmp_path, monkeypatch):
    reason = s3server_missing_reason()
    if reason:
        pytest.skip(reason)
    data = make_dataset(tmp_path / "synth", n=192, classes=4, width=64, height=48, seed=0, workers=1)
    with S3Server(delay_ms=10, auth=False) as srv:
        srv.create_bucket("data")
        srv.upload_dir(data, "data", "train")
        for k, v in srv.env().items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("COORDL_CACHE_DIR", str(tmp_path / "cache"))
        url = "s3://data/train"
        out = tmp_path / "run"
        report = profile_command(
            _job(url, workers=2, fetch_ahead=1), out_dir=out, iters=30, warmup=3, show_progress=False
        )
        src = report["source"]
        assert src["kind"] == "bucket" and src["url"] == url and src["endpoint"] == srv.endpoint
        assert src["objects"] == 192 and src["size_method"] == "the bucket's listing"
        assert report["dataset"]["path"] == url and report["cache_policy"] == "minio"
        assert f"source: bucket {url} at {srv.endpoint}, 192 objects" in summary_text(report)
        assert "Source" in (out / "report.html").read_text()
        # the proxy delays each direction by 10 ms: no request can come back sooner
        assert src["model"]["latency_s"] >= 0.020
        check = src["check"]
        assert check["concurrency"] == 2 and check["bound"] == "latency"
        assert abs(check["error"]) <= max(check["spread"], TARGET_ERROR), check
        v = report["verdict"]
        assert report["bound"] == "fetch" and v["model_bound"] == "fetch"
        assert "a bucket:" in v["sentence"]
        assert not v["disagrees"] or v["causes"], v["sentence"]  # agrees within the real run's own spread
        half = int(report["dataset"]["bytes"] / 2)
        result = verify_command(out, _job(url, workers=2, fetch_ahead=1, cache_bytes=half), iters=30,
                                show_progress=False)  # fmt: skip
    assert result["change"] == {"cache_bytes": half}
    assert result["predicted_bound"] == "fetch"
    allowed = TARGET_ERROR + v["spread"]  # the target, widened by how much the real run's own rate varied
    assert abs(result["error"]) <= allowed or result["note"], result

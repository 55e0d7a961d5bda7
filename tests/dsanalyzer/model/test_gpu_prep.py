"""GPU prep's what-if (dsanalyzer/model/gpu_prep.py): unknown without a probe, the GPU shared with the step."""

from __future__ import annotations

import pytest

from dsanalyzer.model.gpu_prep import gpu_prep_remedy, predict_gpu_prep
from dsanalyzer.model.stages import Point
from dsanalyzer.model.whatif import Model
from tests.dsanalyzer.model.test_whatif import synthetic_report

NO_GPU = {"available": False, "why": "no CUDA device (torch.cuda.is_available() is False)"}


def prep_bound(gpu: dict | None = None) -> Model:
    """A prep-bound job: 380 samples/s of CPU prep against an 800 samples/s step."""
    rep = synthetic_report(cache_policy="minio", cache_bytes=2e9)
    if gpu is not None:
        rep["gpu_prep"] = gpu
    return Model.from_report(rep)


def point(m: Model, storage: float | None = None) -> Point:
    return Point(m.cache_bytes, m.cpus, storage or m.storage_bytes_per_s, policy="minio", workers=2)


def test_without_a_gpu_measurement_gpu_prep_is_unknown_and_says_why():
    for m in (prep_bound(), prep_bound(NO_GPU)):  # an older report, and one whose probe found no GPU
        assert predict_gpu_prep(m, point(m)) is None
        r = gpu_prep_remedy(m)
        assert r.samples_per_s is None and r.why_unknown.startswith("unknown without a GPU")
        assert r.loader_args["device"] == "'gpu'" and not r.removes_stall(800.0)
    assert "torch.cuda.is_available() is False" in gpu_prep_remedy(prep_bound(NO_GPU)).why_unknown


def test_the_gpu_runs_the_step_and_the_prep_one_after_the_other():
    m = prep_bound({"samples_per_s": 3200.0, "cpu_s_per_sample": 1e-4, "size": 224})
    p = predict_gpu_prep(m, point(m))
    assert p is not None and p.bound == "compute"
    assert p.samples_per_s == pytest.approx(1 / (1 / 800.0 + 1 / 3200.0))  # 640, not the step's 800
    assert p.samples_per_s > m.predict(m.cache_bytes, 2, m.storage_bytes_per_s, policy="minio").samples_per_s
    r = gpu_prep_remedy(m)
    assert r.samples_per_s == pytest.approx(640.0) and r.cost["gpu_prep_share"] == pytest.approx(0.2)
    assert r.loader_args["transform"] == "coordl.dali.train_pipeline(224)"


def test_slow_storage_or_a_busy_cpu_still_binds():
    m = prep_bound({"samples_per_s": 3200.0, "cpu_s_per_sample": 1e-4})
    slow = predict_gpu_prep(m, point(m, storage=1e7))  # a 10 MB/s disk, but the 2 GB cache holds it all
    assert slow is not None and slow.samples_per_s == pytest.approx(640.0)  # all cached: storage idle
    cold = Point(0.0, 2, 1e7, policy="minio", workers=2)  # nothing cached: 100 items/s from storage
    p = predict_gpu_prep(m, cold)
    assert p is not None and p.bound == "fetch" and p.samples_per_s == pytest.approx(100.0)
    busy = prep_bound({"samples_per_s": 3200.0, "cpu_s_per_sample": 5e-3})  # 2 cores / 5 ms = 400/s
    q = predict_gpu_prep(busy, point(busy))
    assert q is not None and q.bound == "prep" and q.samples_per_s == pytest.approx(400.0)

"""The remedies' probes: a remote hit on loopback Redis (measure/peer.py) and GPU prep (measure/gpu_prep.py),
whose bookkeeping runs here with a CPU decoder in place of the GPU's."""

from __future__ import annotations

import io
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

import coordl
from coordl.datasets.synth import make_dataset
from dsanalyzer.measure.gpu_prep import probe_gpu_prep, sample_side
from dsanalyzer.measure.peer import measure_peer_fetch
from dsanalyzer.model.whatif import Model
from tests.dsanalyzer.model.test_whatif import synthetic_report


def pil_prep(raws):
    """A CPU stand-in for the GPU decoder: decode, crop to 32 x 32, stack."""
    images = [np.asarray(Image.open(io.BytesIO(r)).convert("RGB").resize((32, 32))) for r in raws]
    return torch.from_numpy(np.stack(images))


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    root = make_dataset(tmp_path_factory.mktemp("jpegs"), 24, 2, width=96, height=80)
    return coordl.ImageFolder(str(root), transform=coordl.transforms.train_transform(48, resize=56))


def test_gpu_prep_probe_without_a_gpu_says_why():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the probe runs")
    r = probe_gpu_prep(object())
    assert r == {"available": False, "why": "no CUDA device (torch.cuda.is_available() is False)"}


def test_gpu_prep_probe_decodes_the_jobs_own_items_and_records_rate_cpu_and_size(jpegs):
    r = probe_gpu_prep(jpegs, items=16, seconds=0.3, prep_batch=pil_prep, device="cpu")
    assert r["available"] and r["items"] == 16 and r["samples"] >= 32  # every item at least twice
    assert r["samples_per_s"] > 0 and 0 < r["cpu_s_per_sample"] < 1 / r["samples_per_s"] * 1.5
    assert r["size"] == 48 == sample_side(jpegs, jpegs.fetch(0), 0)  # the job's own crop
    assert r["decoder"] == "pil_prep"


def test_gpu_prep_probe_refuses_items_that_are_not_jpeg():
    class Blobs:
        def __len__(self):
            return 10

        def fetch(self, i):
            return bytes([i]) * 100

        def prep(self, raw, i):
            return raw

    r = probe_gpu_prep(Blobs(), prep_batch=pil_prep, device="cpu")
    assert not r["available"] and "not all JPEG" in r["why"]


def test_a_report_with_the_probes_gives_the_model_its_fields():
    rep = synthetic_report(
        peer={"item_s": 4e-5, "batch_s": 2e-4},
        gpu_prep={"available": True, "samples_per_s": 3000.0, "cpu_s_per_sample": 1e-4, "size": 224},
    )
    m = Model.from_report(rep)
    assert (m.peer_item_s, m.peer_batch_s) == (4e-5, 2e-4)
    assert (m.gpu_prep_per_s, m.gpu_prep_cpu_s, m.gpu_prep_size, m.gpu_prep_why) == (3000.0, 1e-4, 224, "")
    old = Model.from_report(synthetic_report())  # before the probes: unknown, and why
    assert old.peer_item_s is None and old.gpu_prep_per_s is None and "did not probe" in old.gpu_prep_why
    assert m.params()["gpu_prep_per_s"] == 3000.0 and m.params()["peer_item_s"] == 4e-5


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_peer_probe_measures_a_per_item_cost_that_grows_with_the_item():
    small = measure_peer_fetch(10_000, 16)
    large = measure_peer_fetch(2_000_000, 16)
    assert "error" not in small and "error" not in large
    assert large["item_s"] > 5 * small["item_s"] > 0  # 200x the bytes: the copies dominate
    assert small["batch"] == 16 and small["batch_s"] >= 0

"""DALILoader(device="gpu"): nvJPEG decode and GPU augmentation. Marked ``gpu``: skipped without CUDA.

These run on the accelerator machine when a session has one. They need a CUDA build of torch
(the project's pinned torch is CPU-only, so there they are skipped as well).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("nvidia.dali", reason="coordl.dali needs NVIDIA DALI: pip install -e .[dali]")

import coordl  # noqa: E402
from coordl.dali import DALILoader, eval_pipeline, train_pipeline  # noqa: E402

pytestmark = pytest.mark.gpu


def test_gpu_batches_are_cuda_tensors_in_coordl_dataloader_order(jpeg_folder):
    kw = dict(batch_size=12, shuffle=True)
    ref = coordl.DataLoader(coordl.ImageFolder(jpeg_folder), generator=torch.Generator().manual_seed(2), **kw)
    expected = [[y.tolist() for _x, y in ref] for _ in range(2)]
    ref.close()
    loader = DALILoader(coordl.ImageFolder(jpeg_folder), generator=torch.Generator().manual_seed(2), device="gpu",
                        cache_bytes=32 << 20, transform=train_pipeline(32), seed=1, **kw)  # fmt: skip
    got = []
    for _ in range(2):
        epoch = []
        for images, labels in loader:
            assert images.is_cuda and labels.is_cuda
            assert images.dtype == torch.float32 and images.shape[1:] == (3, 32, 32)
            epoch.append(labels.tolist())
        got.append(epoch)
    stats = loader.stats()
    loader.close()
    assert got == expected
    assert stats["cache_hits"] == 40 and stats["cache_misses"] == 40


def test_gpu_decode_normalizes_like_the_cpu(gray_folder):
    # Uniform images: nvJPEG and the CPU decoder agree to within JPEG rounding (2 levels).
    out = {}
    for device in ("cpu", "gpu"):
        with DALILoader(coordl.ImageFolder(gray_folder), batch_size=8, device=device,
                        transform=eval_pipeline(16)) as loader:  # fmt: skip
            images, labels = next(iter(loader))
            out[device] = (images.mean(dim=(2, 3)).cpu().numpy(), labels.cpu().numpy())
    np.testing.assert_array_equal(out["cpu"][1], out["gpu"][1])
    np.testing.assert_allclose(out["cpu"][0], out["gpu"][0], atol=2 / 255 / 0.224)


def test_gpu_loader_built_after_cuda_is_initialised(jpeg_folder):
    # The training script touched the GPU first: DALI cannot fork its workers now; the loader spawns them.
    torch.zeros(1, device="cuda")
    with DALILoader(coordl.ImageFolder(jpeg_folder), batch_size=20, device="gpu", transform=train_pipeline(32),
                    cache_bytes=32 << 20) as loader:  # fmt: skip
        for _ in range(2):
            assert sum(len(labels) for _images, labels in loader) == 40
        assert loader.stats()["cache_hits"] == 40


def test_gpu_fused_and_unfused_crop_have_the_same_shapes(jpeg_folder):
    for fused in (True, False):
        with DALILoader(coordl.ImageFolder(jpeg_folder), batch_size=10, device="gpu",
                        transform=train_pipeline(24, fused=fused)) as loader:  # fmt: skip
            assert {tuple(x.shape) for x, _y in loader} == {(10, 3, 24, 24)}

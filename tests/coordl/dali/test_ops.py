"""coordl.dali's prep descriptions: validation, and both crop variants on DALI's CPU backend."""

from __future__ import annotations

import pytest

pytest.importorskip("nvidia.dali", reason="coordl.dali needs NVIDIA DALI: pip install -e .[dali]")

import coordl  # noqa: E402
from coordl.dali import DALILoader, DALITransform, eval_pipeline, train_pipeline  # noqa: E402


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(size=0), "size"),
        (dict(size=32, scale=(0.5, 0.1)), "scale"),
        (dict(size=32, ratio=(0, 1)), "ratio"),
        (dict(size=32, std=(1, 0, 1)), "std"),
    ],
)
def test_bad_transform_options_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DALITransform(**kwargs)


def test_a_bad_device_is_named():
    with pytest.raises(ValueError, match="device"):
        train_pipeline(32)(None, "tpu")


@pytest.mark.parametrize(
    "transform", [train_pipeline(24, fused=False), train_pipeline(24, flip=False), eval_pipeline(24)]
)
def test_every_variant_gives_the_requested_size(jpeg_folder, transform):
    with DALILoader(coordl.ImageFolder(jpeg_folder), batch_size=10, transform=transform) as loader:
        assert {tuple(x.shape) for x, _y in loader} == {(10, 3, 24, 24)}


@pytest.mark.parametrize(
    "transform", [train_pipeline(32), train_pipeline(32, fused=False), eval_pipeline(32)]
)
def test_the_gpu_graph_is_valid_for_this_dali_without_a_gpu(transform):
    # DALI checks operator and argument names when the graph is traced, before any CUDA work: the GPU
    # path's operators (mixed decoder, its memory paddings, GPU resize/crop) exist with these arguments.
    from nvidia.dali import fn, types
    from nvidia.dali.pipeline import Pipeline

    pipe = Pipeline(batch_size=4, num_threads=1, device_id=0)
    with pipe:
        jpegs = fn.external_source(source=lambda info: None, batch=True, batch_info=True, dtype=types.UINT8)
        out = transform(jpegs, "gpu")
    assert out.device == "gpu"

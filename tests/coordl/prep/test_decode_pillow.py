"""Images Pillow decodes (PNG of any depth, palette, RGBA) come out as writable arrays: torch takes them
without "The given NumPy array is not writable" (issue 61 saw it from coordl/prep/transforms.py)."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from coordl.prep.decode import decode_image
from coordl.prep.transforms import train_transform


def _png(mode: str) -> bytes:
    rng = np.random.default_rng(0)
    if mode == "I;16":
        img = Image.fromarray(rng.integers(0, 65535, (40, 60), dtype=np.uint16))
    elif mode == "P":
        img = Image.fromarray(rng.integers(0, 255, (40, 60, 3), dtype=np.uint8)).convert("P")
    else:
        img = Image.fromarray(rng.integers(0, 255, (40, 60, len(mode)), dtype=np.uint8), mode)
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "P", "I;16"])
def test_a_png_decodes_to_a_writable_array_torch_takes_without_a_warning(mode: str) -> None:
    raw = _png(mode)
    arr = decode_image(raw)
    assert arr.flags.writeable and arr.shape == (40, 60, 3) and arr.dtype == np.uint8
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's UserWarning would fail here
        torch.from_numpy(arr)
        out = train_transform(32)(raw)
    assert tuple(out.shape[-2:]) == (32, 32)

"""The JPEG flavours the crop decoder's tests run on."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def pil_jpeg(arr: np.ndarray, mode: str = "RGB", **options) -> bytes:
    """``arr`` encoded by Pillow (quality 90) after conversion to ``mode``."""
    buf = io.BytesIO()
    Image.fromarray(arr).convert(mode).save(buf, format="JPEG", quality=90, **options)
    return buf.getvalue()


def jpeg_flavours(pixels: np.ndarray) -> dict[str, bytes]:
    """``pixels`` as each JPEG flavour the crop decoder must handle: chroma subsampling 4:2:0 / 4:2:2 /
    4:4:4, greyscale, progressive, and restart markers every MCU row."""
    return {
        "420": pil_jpeg(pixels, subsampling=2),
        "422": pil_jpeg(pixels, subsampling=1),
        "444": pil_jpeg(pixels, subsampling=0),
        "grey": pil_jpeg(pixels, "L"),
        "progressive": pil_jpeg(pixels, subsampling=2, progressive=True),
        "restart": pil_jpeg(pixels, subsampling=2, restart_marker_rows=1),
    }

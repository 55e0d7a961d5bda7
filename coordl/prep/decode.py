"""Image bytes to an HWC uint8 RGB array: simplejpeg (libjpeg-turbo) for JPEG, Pillow for the rest.

simplejpeg decodes JPEG (CMYK too: libjpeg-turbo converts it to RGB) at about 2.5x Pillow's speed per core
here; Pillow decodes everything else (PNG, BMP, WebP). Undecodable bytes raise :class:`coordl.errors.CorruptItemError`; the
dataset adds the file path.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import simplejpeg
from PIL import Image, UnidentifiedImageError

from coordl.errors import CorruptItemError

__all__ = ["decode_image"]


def _decode_pillow(raw: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(raw)) as img:
        img.load()  # raises on truncated data instead of returning a partly grey image
        rgb = img.convert("RGB")
    return np.array(rgb)  # writable (np.asarray gives a read-only view of the bytes: torch warns on it)


def decode_image(raw: bytes, min_size: int | None = None, fastdct: bool = False) -> np.ndarray:
    """Decode image bytes into an HWC uint8 RGB array.

    JPEG goes through simplejpeg; when ``min_size`` is given and the image's shorter side is at least
    twice it, libjpeg-turbo scales down in the DCT domain (both sides stay >= ``min_size``), which
    is faster than decoding at full size and resizing. Anything simplejpeg rejects (PNG, CMYK JPEG)
    is retried with Pillow; if that fails too, :class:`CorruptItemError` is raised.
    """
    data = raw
    jpeg_error = None
    if simplejpeg.is_jpeg(data):
        try:
            kwargs: dict[str, Any] = {}
            if min_size:
                height, width, _, _ = simplejpeg.decode_jpeg_header(data)
                if min(height, width) >= 2 * min_size:
                    kwargs = {"min_height": min_size, "min_width": min_size}
            return simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=fastdct, **kwargs)
        except ValueError as e:  # CMYK, lossless or damaged: let Pillow decide
            jpeg_error = e
    try:
        return _decode_pillow(bytes(data))
    except Exception as e:  # Pillow raises many types (OSError, SyntaxError, ValueError...)
        if isinstance(e, UnidentifiedImageError):  # its message shows "<_io.BytesIO object at 0x...>"
            reason = f"not a format Pillow knows (first bytes {bytes(data[:8]).hex(' ')})"
        else:
            reason = str(e) or type(e).__name__
        detail = reason if jpeg_error is None else f"simplejpeg: {jpeg_error}; Pillow: {reason}"
        raise CorruptItemError(f"cannot decode image ({len(data)} bytes): {detail}") from e

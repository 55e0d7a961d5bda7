"""Decode only the box a random crop keeps, at a reduced DCT scale where the crop allows.

A random-resized crop keeps about half of an image's pixels on average (scale drawn from (0.08, 1)),
yet a full decode pays for all of them. The crop's box needs only the image's size, which the JPEG
header gives, so the box can be drawn before decoding and the decoder told to skip the rest:
libjpeg-turbo's ``jpeg_skip_scanlines`` (rows above the box: entropy decoding only),
``jpeg_crop_scanline`` (columns outside it: no IDCT, upsampling or colour conversion), stopping after
its last row, and ``scale_denom`` 2, 4 or 8 when the box is at least that many times the output size
(a smaller IDCT instead of decoding pixels the resize would average away).

The decoder is the small C extension ``coordl.prep._cropjpeg`` (coordl/prep/_jpeg/cropjpeg.c), built by
the editable install against Debian's libjpeg62-turbo-dev. Without it (no compiler or headers at
install time) :func:`decode_crop` returns None and the caller decodes the whole image, after one
warning per process.

What falls back to the full decode (the caller's ``Decode`` then judges the file, so corrupt and
truncated files raise ``CorruptItemError`` exactly as before): non-JPEG bytes, CMYK/YCCK JPEGs, files
that do not end in the EOI marker (truncated ones), and any libjpeg error or warning while decoding
the box. Corruption inside the entropy-coded rows *below* a box is not seen by that box's decode; a
later crop that covers it, or a full decode, reports it.

The same extension holds the recipe's last step, :data:`to_chw_float` (None when it is not built):
``[flip +] ToTensor + Normalize`` of the resized crop in one pass (see ``transforms._ToTensorNormalize``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import simplejpeg

try:
    # a C extension, which mypy cannot read and which has no stub: its names are Any
    from coordl.prep import _cropjpeg  # type: ignore[attr-defined]
except ImportError as _e:  # built optionally: no compiler or no libjpeg headers at install time
    _cropjpeg = None
    _IMPORT_ERROR: ImportError | None = _e
else:
    _IMPORT_ERROR = None

log = logging.getLogger(__name__)

__all__ = ["AVAILABLE", "jpeg_size", "dct_denom", "decode_crop", "to_chw_float"]

AVAILABLE = _cropjpeg is not None
# to_chw_float(src, height, width, out, scale0, scale1, scale2, shift0, shift1, shift2, flip): src a
# C-contiguous HWC uint8 RGB buffer, out a writable float32 CHW one; out[c] = src[..., c] * scale[c] +
# shift[c] (the multiply and the add rounded separately, as torch's mul_ then add_), mirrored when flip.
# None also for a stale build without it
to_chw_float: Callable[..., None] | None = getattr(_cropjpeg, "to_chw_float", None)
_header = getattr(_cropjpeg, "jpeg_size", None)  # None also for a stale build without it
_warned = False
_EOI = b"\xff\xd9"


def _warn_unavailable() -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning(
            "coordl: the crop decoder (coordl.prep._cropjpeg) is not built (%s); decoding whole images "
            "(install libjpeg62-turbo-dev and a C compiler, then pip install -e . again)",
            _IMPORT_ERROR,
        )


def jpeg_size(raw: Any) -> tuple[int, int] | None:
    """(height, width) of a JPEG whose box the crop decoder can decode; None means "decode it whole".

    None for non-JPEG bytes, an unreadable header, CMYK/YCCK, data not ending in EOI (truncated), or
    when the extension is not built. The extension reads the frame header itself (a few marker
    lengths: ~0.3 us, where simplejpeg's header call sets up a libjpeg decompressor, 1.6-5 us).
    """
    if _cropjpeg is None:
        _warn_unavailable()
        return None
    if _header is not None:
        return _header(raw)
    return _header_simplejpeg(raw)  # a build from before jpeg_size: same answers, slower


def _header_simplejpeg(raw: Any) -> tuple[int, int] | None:
    view = memoryview(raw)
    if len(view) < 4 or view[-2:] != _EOI or not simplejpeg.is_jpeg(raw):
        return None
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(raw)
    except ValueError:
        return None
    if colorspace in ("CMYK", "YCCK") or height <= 0 or width <= 0:
        return None
    return int(height), int(width)


def dct_denom(box_h: int, box_w: int, out_h: int, out_w: int) -> int:
    """The largest of 1, 2, 4, 8 that keeps the scaled box at least the output size on both sides."""
    denom = 1
    while denom < 8 and box_h >= 2 * denom * out_h and box_w >= 2 * denom * out_w:
        denom *= 2
    return denom


def decode_crop(
    raw: Any, top: int, left: int, height: int, width: int, out_size: tuple[int, int], fastdct: bool = False
) -> np.ndarray | None:
    """The box's pixels (HWC uint8 RGB), at 1/denom scale when the box is >= 2x ``out_size``.

    ``out_size`` is (height, width) of what the caller resizes the box to. At denom 1 the pixels equal
    a full decode's cropped to the box (same libjpeg-turbo, same IDCT and upsampling). With a reduced
    scale the box edges round outwards to whole scaled pixels (at most ``denom - 1`` source pixels).
    Returns None when libjpeg reports anything (the caller decodes the whole image instead).
    """
    if _cropjpeg is None:
        _warn_unavailable()
        return None
    denom = dct_denom(height, width, out_size[0], out_size[1])
    try:
        buf, rows, cols = _cropjpeg.decode_crop(raw, top, left, height, width, denom, fastdct)
    except _cropjpeg.Error:
        return None
    return np.frombuffer(buf, dtype=np.uint8).reshape(rows, cols, 3)

"""Where decode time goes, for ``prep_recipes.cpu_table``: the entropy-decoding share, and per-round spreads.

A crop decode skips the IDCT, upsampling and colour conversion outside the crop's box, never the Huffman
decoding of the rows above and beside it (unless the file is crop-indexed): the larger the entropy
decoding's share of a full decode, the less a crop decode can save. Photographs at quality 96 and 4:4:4
carry more coefficients per pixel than the synthetic images at quality 90 and 4:2:0, and more pixels per
coefficient to reconstruct: which share grows is measured, not assumed.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def entropy_timers(raws: list[bytes]) -> dict[str, Callable[[], float]]:
    """A full decode and a 1/8-scale one (simplejpeg) of the JPEGs among ``raws``. At 1/8 the IDCT keeps
    only the DC term and upsampling and colour conversion touch 1/64 of the pixels, but every coefficient
    is still Huffman-decoded: its time over the full decode's is the entropy-decoding share (an upper
    bound by the little left), which no crop decode of a file without restart markers can skip."""
    import simplejpeg

    def decodes(raw: bytes) -> bool:
        try:
            simplejpeg.decode_jpeg_header(raw)
            simplejpeg.decode_jpeg(raw, min_height=1, min_width=1)
        except ValueError:  # PNG, CMYK: left to Pillow by the recipes, out of this measure
            return False
        return True

    jpegs = [r for r in raws if decodes(r)]

    def timer(**kw: int) -> Callable[[], float]:
        def run() -> float:
            t = time.process_time()
            for raw in jpegs:
                simplejpeg.decode_jpeg(raw, colorspace="RGB", **kw)
            return (time.process_time() - t) / len(jpegs)

        return run

    return {"decode_full": timer(), "decode_eighth": timer(min_height=1, min_width=1)}


def spread(label: str, samples: dict[str, list[float]]) -> str:
    """The min-max over rounds of each round's ratios (the timers of a round ran back to back)."""

    def rng(num: str, den: str) -> str:
        if num not in samples or den not in samples:
            return "-"
        r = [a / b for a, b in zip(samples[num], samples[den], strict=True)]
        return f"{min(r):.2f}-{max(r):.2f}x"

    return (
        f"- {label}: full / crop decode {rng('standard_full', 'standard')}, full / crop-indexed "
        f"{rng('standard_full', 'standard_indexed')}, DALI standard / crop decode "
        f"{rng('dali_standard', 'standard')}, entropy share {rng('decode_eighth', 'decode_full')}"
    )

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


def _groups(raws: list[bytes]) -> dict[str, list[bytes]]:
    """``raws`` by colour layout (simplejpeg's header: 4:4:4, 4:2:2, 4:2:0, gray), and again by bits per pixel
    (ImageNet's files average ~5.4: ~115 KB at ~450x380); PNG and CMYK files left out."""
    import simplejpeg

    out: dict[str, list[bytes]] = {}
    for raw in raws:
        try:
            _h, _w, space, sub = simplejpeg.decode_jpeg_header(raw)
        except ValueError:
            continue
        out.setdefault(f"{space} {sub}", []).append(raw)
        bpp = 8 * len(raw) / (_h * _w)
        band = next(f"{lo}-{hi}" for lo, hi in ((0, 2), (2, 4), (4, 6), (6, 99)) if bpp < hi)
        out.setdefault(f"{band} bits per pixel", []).append(raw)
    return out


def main() -> None:
    """``python benchmarks/decode_share.py``: the entropy share and bits per pixel, synthetic against the
    photographs by chroma layout (one process, CPU time, median of the rounds, groups alternated)."""
    import argparse
    import os
    import statistics

    import datakind
    import prep_recipes
    import simplejpeg

    p = argparse.ArgumentParser(description=main.__doc__.split("\n\n")[0] if main.__doc__ else None)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--files", type=int, default=400, help="photographs, spread over the dataset of 2000")
    args = p.parse_args()
    print(f"load average {os.getloadavg()}")
    groups = {"synthetic 500x375 q90 4:2:0": prep_recipes._images(500, 375, 96)}
    groups.update({f"photos {k}": v for k, v in _groups(datakind.photo_jpegs(args.files)).items()})
    timers = {f"{g}/{k}": t for g, raws in groups.items() for k, t in entropy_timers(raws).items()}
    for t in timers.values():
        t()
    runs: dict[str, list[float]] = {k: [] for k in timers}
    for _ in range(args.rounds):
        for k, t in timers.items():
            runs[k].append(t())
    print(
        "\n| images | files | bits per pixel | full decode us/Mpx | entropy share (1/8-scale / full), min-max |"
    )
    print("|---|---|---|---|---|")
    for g, raws in groups.items():
        px = [h * w for h, w, *_ in map(simplejpeg.decode_jpeg_header, raws)]
        full, eighth = runs[f"{g}/decode_full"], runs[f"{g}/decode_eighth"]
        shares = [a / b for a, b in zip(eighth, full, strict=True)]
        print(
            f"| {g} | {len(raws)} | {8 * sum(map(len, raws)) / sum(px):.2f} | "
            f"{statistics.median(full) * len(raws) / sum(px) * 1e12:.0f} | "
            f"{statistics.median(shares):.0%} ({min(shares):.0%}-{max(shares):.0%}) |"
        )
    print(f"\nload average after {os.getloadavg()}")


if __name__ == "__main__":
    main()

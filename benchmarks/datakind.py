"""The dataset a decode-bound benchmark runs on: ``coordl synth`` images or ``coordl synth --photos``.

``coordl synth`` images are smooth, one size (500x375), quality 90, 4:2:0; the photographic dataset
(``docs/datasets.md``, "Photographs") has ImageNet's spread of sizes, qualities (mostly 96), chroma
layouts (mostly 4:4:4) and odd files. The benchmarks take ``--data-kind synth|photos`` (or a photos row
beside the synthetic ones) and build the same number of files of either kind here, with the same seed
and classes, kept under ``data_dir`` so that every benchmark reuses one build.
"""

from __future__ import annotations

import argparse
from pathlib import Path

KINDS = ("synth", "photos")
DEFAULT_DIR = "/var/tmp/coordl-bench-data"


def make_dataset(kind: str, root: str | Path, n: int, classes: int = 10, seed: int = 0) -> Path:
    """``n`` files of ``kind`` under ``root`` (built once; the same parameters return at once)."""
    if kind == "photos":
        from coordl.datasets import photos

        return photos.make_dataset(root, n=n, classes=classes, seed=seed)
    if kind == "synth":
        from coordl.datasets import synth

        return synth.make_dataset(root, n=n, classes=classes, seed=seed)
    raise ValueError(f"--data-kind: {kind!r} is not one of {', '.join(KINDS)}")


def photos_root(n: int, classes: int = 10, seed: int = 0, data_dir: str | Path = DEFAULT_DIR) -> Path:
    """The shared photographic dataset of ``n`` files (``data_dir/photos-N-C``, seed 0 unless given)."""
    suffix = f"-s{seed}" if seed else ""
    return make_dataset("photos", Path(data_dir) / f"photos-{n}-{classes}{suffix}", n, classes, seed)


def photo_jpegs(count: int, n: int = 2000, data_dir: str | Path = DEFAULT_DIR) -> list[bytes]:
    """The bytes of ``count`` files spread evenly over the photographic dataset of ``n`` (odd ones included)."""
    files = sorted(photos_root(n, data_dir=data_dir).glob("class_*/*.JPEG"))
    step = max(1, len(files) // count)
    return [p.read_bytes() for p in files[::step][:count]]


def add_argument(parser: argparse.ArgumentParser) -> None:
    """``--data-kind synth|photos`` (default synth, the figures in reports/BENCHMARKS.md)."""
    parser.add_argument(
        "--data-kind", choices=KINDS, default="synth",
        help="synth: coordl synth images (500x375 q90 4:2:0); photos: coordl synth --photos (ImageNet's "
        "spread of sizes, qualities, chroma, odd files), the same number of files",
    )  # fmt: skip

"""Synthetic ImageFolder datasets: N JPEGs in C classes, deterministic by seed, no download needed.

The quick start, the tests and the benchmarks need a realistic image dataset on a machine with no
network. Each image is a smooth random colour field, a class-specific stripe pattern and tint, a few
random shapes and pixel noise, so that

- a small CNN learns the classes well above chance (tint and stripe angle/frequency depend on the
  class; everything else is per-image noise);
- the JPEG size is realistic: about 80-110 KB at 500x375, quality 90, like an ImageNet photo, so
  that fetch and decode costs are representative (a flat synthetic image would be ~10 KB).

Image ``i`` depends only on ``(seed, i)``, so generation runs in parallel over cores and gives the
same bytes every time. A marker file records the parameters: calling :func:`make_dataset` again
with the same parameters returns at once. Layout: ``root/class_XXX/XXXXXX.jpg`` (class = i mod C).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np
import simplejpeg
from PIL import Image, ImageDraw

from coordl.datasets.marker import check_root

__all__ = ["make_dataset", "make_image", "image_path", "add_parser"]

MARKER = ".coordl_synth.json"
_FORMAT_VERSION = 1  # bump when the image recipe changes, so old datasets are regenerated


def image_path(root: str | os.PathLike, index: int, classes: int) -> Path:
    """Where image ``index`` lives."""
    return Path(root) / f"class_{index % classes:03d}" / f"{index:06d}.jpg"


def _class_style(label: int, classes: int) -> tuple[np.ndarray, float, float]:
    """(RGB tint, stripe angle, stripe period in pixels) of a class: the learnable signal."""
    hue = label / max(classes, 1)
    phase = 2 * np.pi * hue
    tint = 128 + 90 * np.array([np.cos(phase), np.cos(phase - 2.094), np.cos(phase + 2.094)])
    angle = np.pi * ((label * 0.618) % 1.0)
    period = 12.0 + 28.0 * ((label * 0.382) % 1.0)
    return tint, angle, period


def make_image(index: int, classes: int, width: int = 500, height: int = 375, seed: int = 0) -> np.ndarray:
    """The HWC uint8 RGB pixels of image ``index`` (a pure function of its arguments)."""
    rng = np.random.default_rng([seed, index])
    label = index % classes
    tint, angle, period = _class_style(label, classes)

    # Smooth field: a coarse random grid upsampled bilinearly (photo-like low frequencies).
    coarse = rng.integers(0, 256, size=(4, 5, 3), dtype=np.uint8)
    field = np.asarray(Image.fromarray(coarse).resize((width, height), Image.Resampling.BILINEAR), np.float32)

    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    jitter = rng.uniform(0, 2 * np.pi)
    stripes = np.sin((xx * np.cos(angle) + yy * np.sin(angle)) * (2 * np.pi / period) + jitter)
    img = 0.45 * field + 0.55 * tint[None, None, :] + 40.0 * stripes[:, :, None]

    pil = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(pil)
    for _ in range(int(rng.integers(2, 6))):
        x0, y0 = rng.integers(0, width), rng.integers(0, height)
        w = rng.integers(max(1, width // 25), max(2, width // 3))
        h = rng.integers(max(1, height // 19), max(2, height // 3))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        box = (int(x0), int(y0), int(x0 + w), int(y0 + h))
        if rng.random() < 0.5:
            draw.ellipse(box, fill=colour)
        else:
            draw.rectangle(box, fill=colour)

    noise = rng.normal(0.0, 15.0, size=(height, width, 3)).astype(np.float32)
    out = np.asarray(pil, np.float32) + noise
    return np.clip(out, 0, 255).astype(np.uint8)


def _write_range(
    root: str, start: int, stop: int, classes: int, width: int, height: int, quality: int, seed: int
) -> int:
    written = 0
    for i in range(start, stop):
        path = image_path(root, i, classes)
        data = simplejpeg.encode_jpeg(
            make_image(i, classes, width, height, seed), quality=quality, colorsubsampling="420"
        )
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # a reader never sees half a file
        written += len(data)
    return written


def make_dataset(
    root: str | os.PathLike,
    n: int,
    classes: int,
    width: int = 500,
    height: int = 375,
    quality: int = 90,
    seed: int = 0,
    workers: int | None = None,
    progress: bool = False,
) -> Path:
    """Write ``n`` JPEGs in ``classes`` class folders under ``root``; return ``root``.

    Deterministic by ``seed``, idempotent (a marker file with the parameters; same parameters:
    returns at once; other parameters: FileExistsError), parallel over ``workers`` processes
    (default: all cores). ``progress``: show progress on stderr (about 30 images/s per core at
    500x375, so a few thousand images take a minute).
    """
    if n <= 0 or classes <= 0 or width <= 0 or height <= 0:
        raise ValueError(
            f"make_dataset: n, classes, width, height must be positive ({n}, {classes}, {width}x{height})"
        )
    if not 1 <= quality <= 100:
        raise ValueError(f"make_dataset: quality must be in 1..100, got {quality}")
    root = Path(root)
    params = {
        "format": _FORMAT_VERSION,
        "n": n,
        "classes": classes,
        "width": width,
        "height": height,
        "quality": quality,
        "seed": seed,
    }
    if check_root(root, params, MARKER):
        return root
    for c in range(min(classes, n)):
        (root / f"class_{c:03d}").mkdir(parents=True, exist_ok=True)
    workers = max(1, min(workers or os.cpu_count() or 1, n))
    bounds = np.linspace(0, n, min(n, workers * 8) + 1).astype(int)
    jobs = [
        (str(root), int(a), int(b), classes, width, height, quality, seed)
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        if b > a
    ]
    from nfs_cache.progress import Progress

    with Progress(n, f"synthesising {n} images in {root}", unit="images", enabled=progress) as bar:
        if workers == 1:
            for job in jobs:
                _write_range(*job)
                bar.update(job[2] - job[1])
        else:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                futures = {pool.submit(_write_range, *job): job[2] - job[1] for job in jobs}
                for fut in as_completed(futures):
                    fut.result()
                    bar.update(futures[fut])
    (root / MARKER).write_text(json.dumps(params))  # written last: its presence means complete
    return root


def _parse_size(text: str) -> tuple[int, int]:
    try:
        w, h = text.lower().split("x")
        size = int(w), int(h)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must look like 500x375, got {text!r}") from None
    if min(size) < 1:
        raise argparse.ArgumentTypeError(f"width and height must be positive, got {text!r}")
    return size


def _run(args: argparse.Namespace) -> int:
    if args.photos:
        from coordl.datasets import photos

        return photos.run_cli(args)
    width, height = args.size or (500, 375)
    start = time.perf_counter()
    try:
        root = make_dataset(
            args.root,
            args.n,
            args.classes,
            width,
            height,
            args.quality or 90,
            args.seed,
            args.workers,
            progress=True,
        )
    except (FileExistsError, NotADirectoryError) as e:
        raise ValueError(f"argument root: {e}") from e
    files = sorted(root.glob("class_*/*.jpg"))
    total = sum(p.stat().st_size for p in files)
    print(
        f"{root}: {len(files)} images in {args.classes} classes, {total / 1e6:.1f} MB "
        f"({total / max(len(files), 1) / 1e3:.0f} KB each), {time.perf_counter() - start:.1f} s",
        file=sys.stdout,
    )
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``coordl synth ROOT --n N --classes C --size WxH --seed S``."""
    from coordl.argtypes import int_between, positive_int

    p = subparsers.add_parser(
        "synth", help="write a synthetic ImageFolder dataset (JPEGs, deterministic by seed)"
    )
    p.add_argument("root", help="output directory (root/class_XXX/XXXXXX.jpg)")
    p.add_argument("--n", type=positive_int, default=1000, help="number of images (default 1000)")
    p.add_argument("--classes", type=positive_int, default=10, help="number of classes (default 10)")
    p.add_argument("--size", type=_parse_size, default=None, help="WIDTHxHEIGHT (default 500x375)")
    p.add_argument(
        "--quality", type=int_between(1, 100), default=None, help="JPEG quality, 1..100 (default 90)"
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--workers", type=positive_int, default=None, help="processes (default: all cores)")
    p.add_argument(
        "--photos",
        action="store_true",
        help="crops of real photographs with ImageNet's sizes, qualities and odd files (docs/datasets.md)",
    )
    p.set_defaults(func=_run)

"""Photographic ImageFolder datasets: crops of real photographs re-encoded with ImageNet's file statistics.

``coordl synth`` draws smooth synthetic images, all one size and one JPEG quality: fine for correctness,
optimistic for decode cost and blind to skew. ``coordl synth --photos`` (:func:`make_dataset`) instead
cuts 23 real photographs, shipped under free licences by two Debian packages, into crops at random
places and scales, and re-encodes each with a width, height, quality, chroma subsampling and format
drawn to follow ImageNet-1k's training set (:mod:`coordl.datasets.photo_specs` says where each
distribution comes from), the rare odd files (CMYK JPEGs, a PNG named ``.JPEG``) included.

Sources: only photographs (renderings and drawings of the same packages are left out), read from
``/usr/share``; each photograph's author and licence, as the package's
``/usr/share/doc/<package>/copyright`` (and, for Plasma, the wallpaper's ``metadata.json``) give them,
are in :data:`SOURCES`. File ``i`` depends only on ``(seed, i)`` (and ``n``, for where the odd files
go), so the same parameters give the same bytes, in parallel over all cores (Pillow's encoder; another
Pillow or libjpeg version may change bytes, never the distributions). Layout like ImageNet:
``root/class_XXX/XXXXXX.JPEG`` (class = i mod C). A marker file records the parameters, as for
``coordl synth``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from coordl.datasets.marker import check_root
from coordl.datasets.photo_specs import ImageSpec, draw_spec, odd_positions

__all__ = ["SOURCES", "SourcePhoto", "make_dataset", "image_path", "source_paths", "summary", "run_cli"]

MARKER = ".coordl_photos.json"
_FORMAT_VERSION = 1  # bump when the recipe (specs or rendering) changes, so old datasets are regenerated
_CHUNK = 128  # images per job: each job decodes its photograph once


@dataclass(frozen=True)
class SourcePhoto:
    """One photograph: the Debian package that ships it, its path under the system root, author, licence."""

    package: str
    path: str
    author: str
    licence: str


def _plasma(name: str, author: str) -> SourcePhoto:
    # Debian's copyright file says GPL-2+ for the whole package; the wallpaper's metadata.json, LGPL-3.
    return SourcePhoto(
        "plasma-workspace-wallpapers",
        f"usr/share/wallpapers/{name}/contents/images/2560x1600.jpg",
        author,
        "GPL-2+ (Debian copyright) / LGPL-3 (metadata.json)",
    )


def _mate(name: str, author: str) -> SourcePhoto:
    return SourcePhoto("mate-backgrounds", f"usr/share/backgrounds/mate/nature/{name}.jpg", author, "GPL-2+")


SOURCES: tuple[SourcePhoto, ...] = (
    _plasma("BytheWater", "Maciej Wiklo"),
    _plasma("ColdRipple", "Risto Saukonpää"),
    _plasma("ColorfulCups", "Dmitri Popov"),
    _plasma("DarkestHour", "Risto Saukonpää"),
    _plasma("EveningGlow", "Ian Hex"),
    _plasma("FallenLeaf", "Martin Klapetek"),
    _plasma("Grey", "Sigi Sagi"),
    _plasma("Kite", "Risto Saukonpää"),
    _plasma("OneStandsOut", "Risto Saukonpää"),
    _plasma("Path", "Risto Saukonpää"),
    _plasma("summer_1am", "Risto Saukonpää"),
    _mate("Aqua", "Charles Barbin"),
    _mate("Blinds", "Lennart Poettering, Andrea Cimitan"),
    _mate("Dune", "Marco Cogoni, Hylke Bons"),
    _mate("FreshFlower", "Jens Ansorg"),
    _mate("Garden", "Charles Barbin"),
    _mate("GreenMeadow", "Timothy Schellhase, Lapo Calamandrei"),
    _mate("LadyBird", "Charles Barbin"),
    _mate("RainDrops", "blackcombwhistler07"),
    _mate("Storm", "Sergey Nazarov"),
    _mate("TwoWings", "Charles Barbin, Hylke Bons"),
    _mate("Wood", "Jean-François Fortin Tam"),
    _mate("YellowFlower", "Charles Barbin"),
)
PACKAGES = tuple(dict.fromkeys(s.package for s in SOURCES))


def image_path(root: str | os.PathLike, index: int, classes: int) -> Path:
    """Where file ``index`` lives (``.JPEG``, as in ImageNet, whatever its format)."""
    return Path(root) / f"class_{index % classes:03d}" / f"{index:06d}.JPEG"


def source_paths(system_root: str | os.PathLike = "/") -> list[Path]:
    """The source photographs' paths; FileNotFoundError naming the packages when any is missing."""
    paths = [Path(system_root) / s.path for s in SOURCES]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        pkgs = " ".join(dict.fromkeys(s.package for s, p in zip(SOURCES, paths, strict=True) if p in missing))
        raise FileNotFoundError(
            f"photographic dataset: {len(missing)} of the {len(paths)} source photographs are missing "
            f"(first: {missing[0]}); they come from the Debian packages {pkgs}: "
            f"apt-get install {pkgs} (scripts/setup.sh installs them)"
        )
    return paths


def _pyramid(path: str) -> list[Image.Image]:
    """The photograph decoded, and at 1/2 and 1/4 size: a crop is resized from the nearest larger level."""
    with Image.open(path) as im:
        full = im.convert("RGB")
    return [full, full.reduce(2), full.reduce(4)]


def _add_grain(img: Image.Image, sigma: float, seed: int, index: int) -> Image.Image:
    """Luma noise of ``sigma`` levels (a camera sensor's, which the clean wallpapers lack)."""
    noise = np.random.default_rng([seed, index, 2]).normal(0.0, sigma, (img.height, img.width, 1))
    out = np.asarray(img, np.float32) + noise.astype(np.float32)
    return Image.fromarray(np.clip(out + 0.5, 0, 255).astype(np.uint8))


def render(spec: ImageSpec, pyramid: list[Image.Image], seed: int) -> bytes:
    """The bytes of the file ``spec`` describes, cut from ``pyramid`` (see :func:`_pyramid`)."""
    left, top, right, bottom = spec.box
    scale = (right - left) / spec.width
    level = 0
    while level + 1 < len(pyramid) and scale >= 2 ** (level + 1):
        level += 1
    img, k = pyramid[level], 2**level
    box = (left / k, top / k, min(right / k, img.width), min(bottom / k, img.height))
    out = img.resize((spec.width, spec.height), Image.Resampling.BILINEAR, box=box)
    if spec.flip:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    if spec.grain > 0:
        out = _add_grain(out, spec.grain, seed, spec.index)
    buf = io.BytesIO()
    if spec.kind == "png":
        out.save(buf, "PNG")
    elif spec.kind == "gray":
        out.convert("L").save(buf, "JPEG", quality=spec.quality)
    elif spec.kind == "cmyk":
        out.convert("CMYK").save(buf, "JPEG", quality=spec.quality, subsampling=spec.subsampling)
    else:
        progressive = spec.kind == "progressive"
        out.save(buf, "JPEG", quality=spec.quality, subsampling=spec.subsampling, progressive=progressive)
    return buf.getvalue()


def _write_group(root: str, classes: int, seed: int, source: str, specs: list[ImageSpec]) -> int:
    pyramid = _pyramid(source)
    written = 0
    for spec in specs:
        data = render(spec, pyramid, seed)
        path = image_path(root, spec.index, classes)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # a reader never sees half a file
        written += len(data)
    return written


def _jobs(root: Path, n: int, classes: int, seed: int, paths: list[Path]) -> list[tuple]:
    """The work, grouped by photograph so that each job decodes one photograph once."""
    sizes = []
    for p in paths:
        with Image.open(p) as im:
            sizes.append(im.size)
    odd = odd_positions(n, seed)
    by_source: dict[int, list[ImageSpec]] = {}
    for i in range(n):
        spec = draw_spec(i, seed, sizes, odd)
        by_source.setdefault(spec.source, []).append(spec)
    return [
        (str(root), classes, seed, str(paths[s]), specs[a : a + _CHUNK])
        for s, specs in sorted(by_source.items())
        for a in range(0, len(specs), _CHUNK)
    ]


def make_dataset(
    root: str | os.PathLike,
    n: int,
    classes: int,
    seed: int = 0,
    workers: int | None = None,
    progress: bool = False,
    system_root: str | os.PathLike = "/",
) -> Path:
    """Write ``n`` photographic files in ``classes`` class folders under ``root``; return ``root``.

    Args:
        root: output directory, new or empty, or one this function wrote with the same parameters
            (returned at once); another dataset there raises FileExistsError.
        n: number of files. classes: number of class folders (file ``i`` goes to class ``i mod C``).
        seed: the same seed gives the same bytes.
        workers: processes (default: all cores; ~100 files/s per core).
        progress: show progress on stderr.
        system_root: where ``usr/share/...`` is (tests point it elsewhere).

    Raises:
        FileNotFoundError: the source photographs are missing; the message names the Debian packages.
    """
    if n <= 0 or classes <= 0:
        raise ValueError(f"photographic dataset: n and classes must be positive ({n}, {classes})")
    root = Path(root)
    params = {"format": _FORMAT_VERSION, "kind": "photos", "n": n, "classes": classes, "seed": seed}
    if check_root(root, params, MARKER):
        return root
    paths = source_paths(system_root)
    for c in range(min(classes, n)):
        (root / f"class_{c:03d}").mkdir(parents=True, exist_ok=True)
    jobs = _jobs(root, n, classes, seed, paths)
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    from nfs_cache.progress import Progress

    with Progress(n, f"cutting {n} photographs into {root}", unit="images", enabled=progress) as bar:
        if workers == 1:
            for job in jobs:
                _write_group(*job)
                bar.update(len(job[-1]))
        else:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                futures = {pool.submit(_write_group, *job): len(job[-1]) for job in jobs}
                for fut in as_completed(futures):
                    fut.result()
                    bar.update(futures[fut])
    (root / MARKER).write_text(json.dumps(params))  # written last: its presence means complete
    return root


def summary(root: str | os.PathLike) -> dict:
    """What a dataset holds, from file sizes and headers: sizes in bytes and pixels, formats and modes."""
    files = sorted(Path(root).glob("class_*/*.JPEG"))
    if not files:
        raise FileNotFoundError(f"{root}: no class_*/*.JPEG files (not a photographic dataset)")
    kinds: Counter[str] = Counter()
    nbytes, widths, heights = [], [], []
    for p in files:
        nbytes.append(p.stat().st_size)
        with Image.open(p) as im:
            widths.append(im.width)
            heights.append(im.height)
            prog = im.format == "JPEG" and bool(im.info.get("progressive") or im.info.get("progression"))
            kinds[f"{im.format} {im.mode}{' progressive' if prog else ''}"] += 1
    b = np.asarray(nbytes, np.float64)
    return {
        "files": len(files),
        "bytes_total": int(b.sum()),
        "bytes_mean": float(b.mean()),
        "bytes_percentiles": {q: float(np.percentile(b, q)) for q in (1, 10, 50, 90, 99)},
        "bytes_min": int(b.min()),
        "bytes_max": int(b.max()),
        "width_mean": float(np.mean(widths)),
        "height_mean": float(np.mean(heights)),
        "kinds": dict(kinds),
    }


def run_cli(args: argparse.Namespace) -> int:
    """``coordl synth ROOT --photos``: the options of ``coordl synth`` that a photograph's file sets are refused."""
    for option in ("size", "quality"):
        if getattr(args, option) is not None:
            raise ValueError(f"argument --{option}: not used with --photos (each file's follows ImageNet's)")
    start = time.perf_counter()
    try:
        root = make_dataset(args.root, args.n, args.classes, args.seed, args.workers, progress=True)
    except (FileExistsError, NotADirectoryError) as e:
        raise ValueError(f"argument root: {e}") from e
    s = summary(root)
    pct = s["bytes_percentiles"]
    print(
        f"{root}: {s['files']} photographs in {args.classes} classes, {s['bytes_total'] / 1e6:.1f} MB "
        f"(mean {s['bytes_mean'] / 1e3:.0f} KB, median {pct[50] / 1e3:.0f} KB, p1-p99 {pct[1] / 1e3:.0f}-"
        f"{pct[99] / 1e3:.0f} KB, mean {s['width_mean']:.0f}x{s['height_mean']:.0f} px), "
        f"{time.perf_counter() - start:.1f} s; formats: {s['kinds']}",
        file=sys.stdout,
    )
    return 0

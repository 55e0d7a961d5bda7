"""The training-prep recipes ``bench_loader.py`` compares, and its one-process CPU table.

Recipes (all end in a 224x224 random-resized crop, flip, normalize to float CHW):

- ``resize_first``: ``train_transform(224, recipe="resize_first")``: decode, resize the shorter side
  to 256, then the random crop (coordl's default before issue 27; what a sample cache keeps);
- ``standard_full``: the standard recipe (the crop of the full-resolution image) with a full decode:
  ``Compose(train_transform(224), crop_decode=False)``;
- ``standard``: ``train_transform(224)``: the standard recipe decoding only the crop's box;
- ``standard_indexed``: the same transform on the same images rewritten by ``coordl crop-index``
  (lossless, restart segments of 32 px): the crop decoder entropy-decodes only the box's segments.

``cpu_table`` times each, one process and one thread, on JPEG bytes held in memory (500x375 and
1000x750, quality 90, 4:2:0, the synthetic dataset's images), against DALI's CPU pipeline for the
same recipe (``coordl.dali.train_pipeline(224)``: ``decoders.image_random_crop`` + resize, one
thread) fed the same bytes. The machine is shared, so the measure is CPU time per sample
(``time.process_time``: every thread of the process, DALI's included), median of ``rounds`` rounds
that alternate the methods.

``--photos [FILES]`` adds a row of FILES files spread over the photographic dataset (``coordl synth
--photos``, ImageNet's spread of sizes, qualities and chroma layouts, odd files included), its timers
alternated with the synthetic rows' in every round; every row also gives the full decode's entropy-decoding
share (``decode_share.py``), the part no crop decode of an ordinary JPEG skips.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

CROP = 224
RECIPES = {
    "resize_first": "resize-first (decode, resize 256, crop)",
    "standard_full": "standard recipe, full decode",
    "standard": "standard recipe, crop decode",
    "standard_indexed": "standard recipe, crop decode, crop-indexed JPEGs",
}
INDEXED = {"standard_indexed"}  # recipes that read the crop-indexed copy of the images
SIZES = ((500, 375), (1000, 750))


def make_transform(recipe: str, size: int = CROP) -> Any:
    """The coordl.transforms pipeline of ``recipe`` (one of :data:`RECIPES`)."""
    from coordl.prep.transforms import Compose, train_transform

    if recipe == "resize_first":
        return train_transform(size, recipe="resize_first")
    if recipe == "standard_full":
        return Compose(list(train_transform(size)), crop_decode=False)
    if recipe in ("standard", "standard_indexed"):
        return train_transform(size)
    raise ValueError(f"unknown recipe {recipe!r}; one of {sorted(RECIPES)}")


def dali_graph(recipe: str, jpegs: Any) -> Any:
    """DALI's CPU graph for ``recipe`` on the encoded-bytes node ``jpegs`` (inside a pipeline)."""
    from nvidia.dali import fn, types

    from coordl.dali.ops import DALITransform
    from coordl.prep import recipe as params

    if recipe != "resize_first":
        return DALITransform(CROP, fused=recipe == "standard")(jpegs, "cpu")
    images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
    images = fn.resize(images, resize_shorter=params.shorter_side_for(CROP))
    images = fn.random_resized_crop(images, size=(CROP, CROP))
    return fn.crop_mirror_normalize(
        images, dtype=types.FLOAT, output_layout="CHW", mirror=fn.random.coin_flip(),
        mean=[m * 255 for m in params.IMAGENET_MEAN], std=[s * 255 for s in params.IMAGENET_STD],
    )  # fmt: skip


def _images(width: int, height: int, count: int) -> list[bytes]:
    import simplejpeg

    from coordl.datasets.synth import make_image

    return [
        simplejpeg.encode_jpeg(make_image(i, 10, width, height, 0), quality=90, colorsubsampling="420")
        for i in range(count)
    ]


def recipe_bytes(recipe: str, raws: list[bytes]) -> list[bytes]:
    """The JPEG bytes ``recipe`` reads: ``raws``, or their crop-indexed rewrite."""
    if recipe not in INDEXED:
        return raws
    from coordl.prep.cropindex import rewrite_or_keep

    return [rewrite_or_keep(r) for r in raws]  # a PNG or damaged file (photos) stays as it is


def _coordl_timer(recipe: str, raws: list[bytes]) -> Callable[[], float]:
    import torch

    tf = make_transform(recipe)
    raws = recipe_bytes(recipe, raws)

    def run() -> float:
        torch.manual_seed(0)
        t = time.process_time()
        for raw in raws:
            tf(raw)
        return (time.process_time() - t) / len(raws)

    return run


def _dali_timer(recipe: str, raws: list[bytes], batch: int = 32) -> Callable[[], float]:
    from nvidia.dali import fn, types
    from nvidia.dali.pipeline import Pipeline

    arrays = [np.frombuffer(r, dtype=np.uint8) for r in raws]
    batches = [arrays[i : i + batch] for i in range(0, len(arrays) - batch + 1, batch)]
    state = {"next": 0}

    def feed() -> list[np.ndarray]:
        out = batches[state["next"] % len(batches)]
        state["next"] += 1
        return out

    pipe = Pipeline(batch_size=batch, num_threads=1, device_id=None, seed=0, prefetch_queue_depth=1)
    with pipe:
        jpegs = fn.external_source(source=feed, batch=True, dtype=types.UINT8)
        pipe.set_outputs(dali_graph(recipe, jpegs))
    pipe.build()
    pipe.run()  # warm up: first allocations

    def run() -> float:
        t = time.process_time()
        for _ in batches:
            pipe.run()
        return (time.process_time() - t) / (len(batches) * batch)

    return run


def pixel_check(raws: list[bytes], samples: int = 64) -> tuple[int, int, float]:
    """(max abs difference where no DCT scaling applies, max and mean abs difference overall) between
    crop-decoded samples and a full decode + the same crop, as uint8 after the resize to 224."""
    import torch

    from coordl.prep import cropdecode
    from coordl.prep.decode import decode_image
    from coordl.prep.transforms import RandomResizedCrop, _resize

    gen = torch.Generator().manual_seed(0)
    rrc = RandomResizedCrop(CROP, generator=gen)
    exact, worst, means = 0, 0, []
    for i in range(samples):
        raw = raws[i % len(raws)]
        full = decode_image(raw)
        top, left, h, w = rrc.get_params(*full.shape[:2])
        a = _resize(full[top : top + h, left : left + w], CROP, CROP).astype(np.int16)
        box = cropdecode.decode_crop(raw, top, left, h, w, (CROP, CROP))
        if box is None:
            continue
        d = np.abs(a - _resize(box, CROP, CROP).astype(np.int16))
        worst, means = max(worst, int(d.max())), [*means, float(d.mean())]
        if cropdecode.dct_denom(h, w, CROP, CROP) == 1:
            exact = max(exact, int(d.max()))
    return exact, worst, statistics.mean(means) if means else float("nan")


def _alternate(
    timers: dict[str, Callable[[], float]], rounds: int
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Each timer once to warm up, then ``rounds`` rounds of all of them in turn: (seconds per round, median ms)."""
    for timer in timers.values():
        timer()
    samples: dict[str, list[float]] = {k: [] for k in timers}
    for _ in range(rounds):
        for name, timer in timers.items():
            samples[name].append(timer())
    return samples, {k: statistics.median(v) * 1e3 for k, v in samples.items()}


def _rows(count: int, photos: int) -> list[tuple[str, list[bytes]]]:
    """(label, JPEG bytes) of each row: the synthetic sizes, then ``photos`` photographic files."""
    rows = [(f"{w}x{h} q90", _images(w, h, count)) for w, h in SIZES]
    if photos:
        import datakind

        raws = datakind.photo_jpegs(photos)
        rows.append((f"photos ({len(raws)} files, {statistics.mean(map(len, raws)) / 1e3:.0f} KB)", raws))
    return rows


def cpu_table(rounds: int = 5, count: int = 96, dali: bool = True, photos: int = 0) -> dict[str, Any]:
    """Print (and return) CPU ms per sample of each recipe, coordl and DALI, at both image sizes (and on
    ``photos`` files of the photographic dataset); the rounds alternate every row's timers."""
    import decode_share
    import torch

    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    print(f"\n### One process, CPU per sample (ms, median of {rounds} rounds of {count} images)\n")
    header = "| image | " + " | ".join(RECIPES.values())
    header += " | DALI CPU, resize-first | DALI CPU, standard (fused crop decode) | full / crop decode |"
    header += " resize-first / crop decode | DALI standard / crop decode | crop vs full decode pixels |"
    header += " full / crop-indexed | resize-first / crop-indexed | indexed bytes |"
    header += " full decode ms | entropy share (1/8-scale / full decode) |"
    rows = _rows(count, photos)
    timers: dict[str, Callable[[], float]] = {}
    for label, raws in rows:
        row: dict[str, Callable[[], float]] = {r: _coordl_timer(r, raws) for r in RECIPES}
        if dali:
            row["dali_resize_first"] = _dali_timer("resize_first", raws)
            row["dali_standard"] = _dali_timer("standard", raws)
        row.update(decode_share.entropy_timers(raws))
        timers.update({f"{label}/{k}": t for k, t in row.items()})
    samples_all, med_all = _alternate(timers, rounds)
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for label, raws in rows:
        med = {k.split("/", 1)[1]: v for k, v in med_all.items() if k.startswith(f"{label}/")}
        samples = {k.split("/", 1)[1]: v for k, v in samples_all.items() if k.startswith(f"{label}/")}
        exact, worst, mean = pixel_check(raws)
        results[label] = {"ms": med, "runs_ms": samples, "pixels": (exact, worst, mean)}
        cells = [f"{med[r]:.3f}" for r in RECIPES]
        cells += [f"{med[k]:.3f}" if k in med else "-" for k in ("dali_resize_first", "dali_standard")]
        cells.append(f"**{med['standard_full'] / med['standard']:.3f}x**")  # 3 places: the target is 1.25x
        cells.append(f"{med['resize_first'] / med['standard']:.2f}x")
        cells.append(f"{med['dali_standard'] / med['standard']:.2f}x" if "dali_standard" in med else "-")
        cells.append(f"max {exact} (scale 1), max {worst} / mean {mean:.2f} (with DCT scaling)")
        indexed = recipe_bytes("standard_indexed", raws)
        exact_i, _worst_i, _mean_i = pixel_check(indexed)  # the crop of the rewrite vs a full decode of it
        results[label]["pixels_indexed"] = exact_i
        cells.append(f"**{med['standard_full'] / med['standard_indexed']:.2f}x**")
        cells.append(f"**{med['resize_first'] / med['standard_indexed']:.2f}x**")
        cells.append(f"{sum(map(len, indexed)) / sum(map(len, raws)):.3f}x (scale-1 pixels: max {exact_i})")
        cells.append(f"{med['decode_full']:.3f}")
        cells.append(f"{med['decode_eighth'] / med['decode_full']:.0%}")
        print(f"| {label} | " + " | ".join(cells) + " |")
    print("\nPer-round ratios, min-max over the rounds:")
    for label, _raws in rows:
        print(decode_share.spread(label, results[label]["runs_ms"]))
    return results


# The held-out check: images not used to tune crop decode (other content, sizes, qualities, chroma
# subsampling, progressive). "photo": the real photograph matplotlib ships (sample_data/grace_hopper.jpg,
# 512x600), mirror-tiled to the size and cut at random offsets, so its local statistics stay a photo's;
# "synthetic": coordl.datasets.synth images of another seed than the benchmark's. (label, source, width,
# height, quality, Pillow subsampling 0/1/2 = 4:4:4/4:2:2/4:2:0, progressive)
HELD_OUT = (
    ("photo as shipped (512x600)", "photo-file", 0, 0, 0, 0, False),
    ("photo 640x480 q75 4:2:0", "photo", 640, 480, 75, 2, False),
    ("photo 800x600 q95 4:4:4", "photo", 800, 600, 95, 0, False),
    ("photo 1280x960 q90 4:2:2", "photo", 1280, 960, 90, 1, False),
    ("photo 1920x1080 q90 4:2:0 progressive", "photo", 1920, 1080, 90, 2, True),
    ("synthetic 640x480 q95 4:2:2", "synth", 640, 480, 95, 1, False),
    ("synthetic 800x600 q75 4:2:0 progressive", "synth", 800, 600, 75, 2, True),
    ("synthetic 1280x960 q75 4:4:4", "synth", 1280, 960, 75, 0, False),
    ("synthetic 1920x1080 q95 4:2:0", "synth", 1920, 1080, 95, 2, False),
)


def _photo_path() -> str:
    import matplotlib

    return f"{matplotlib.get_data_path()}/sample_data/grace_hopper.jpg"


def _held_out_images(
    source: str, width: int, height: int, quality: int, sub: int, prog: bool, count: int
) -> list[bytes]:
    import io

    from PIL import Image

    from coordl.datasets.synth import make_image
    from coordl.prep.decode import decode_image

    if source == "photo-file":
        with open(_photo_path(), "rb") as f:
            return [f.read()] * count
    rng = np.random.default_rng(1)
    if source == "photo":
        with open(_photo_path(), "rb") as f:
            photo = decode_image(f.read())
        reps = (-(-2 * height // photo.shape[0]), -(-2 * width // photo.shape[1]), 1)
        canvas = np.pad(
            photo, [(0, (r - 1) * n) for r, n in zip(reps, photo.shape, strict=True)], mode="symmetric"
        )
    out = []
    for i in range(count):
        if source == "photo":
            top, left = (
                int(rng.integers(0, canvas.shape[0] - height)),
                int(rng.integers(0, canvas.shape[1] - width)),
            )
            pixels = canvas[top : top + height, left : left + width]
        else:
            pixels = make_image(i, 10, width, height, seed=1)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="JPEG", quality=quality, subsampling=sub, progressive=prog)
        out.append(buf.getvalue())
    return out


def held_out_table(rounds: int = 5, count: int = 64) -> dict[str, Any]:
    """Print (and return) CPU ms per sample of the three recipes on the :data:`HELD_OUT` images."""
    import torch

    from coordl.prep import cropdecode
    from coordl.prep.transforms import RandomResizedCrop

    torch.set_num_threads(1)
    print(
        f"\n### Held-out images, one process, CPU per sample (ms, median of {rounds} rounds of {count} images)\n"
    )
    header = "| images | KB per image | " + " | ".join(RECIPES.values())
    header += " | full / crop decode | resize-first / crop decode | full / crop-indexed | boxes DCT-scaled |"
    header += " crop vs full pixels (scale 1) |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    results: dict[str, Any] = {}
    for label, *spec in HELD_OUT:
        raws = _held_out_images(*spec, count=count)
        timers = {r: _coordl_timer(r, raws) for r in RECIPES}
        samples, med = _alternate(timers, rounds)
        exact, _worst, _mean = pixel_check(raws)
        height, width = cropdecode.jpeg_size(raws[0]) or (0, 0)
        rrc = RandomResizedCrop(CROP, generator=torch.Generator().manual_seed(0))
        boxes = [rrc.get_params(height, width) for _ in range(1000)] if height else []
        scaled = sum(cropdecode.dct_denom(h, w, CROP, CROP) > 1 for _t, _l, h, w in boxes) / max(
            len(boxes), 1
        )
        results[label] = {"ms": med, "runs_ms": samples, "exact": exact, "dct_scaled": scaled}
        cells = [f"{statistics.mean(map(len, raws)) / 1024:.0f}", *(f"{med[r]:.3f}" for r in RECIPES)]
        cells.append(f"**{med['standard_full'] / med['standard']:.3f}x**")
        cells.append(f"{med['resize_first'] / med['standard']:.2f}x")
        cells.append(f"{med['standard_full'] / med['standard_indexed']:.2f}x")
        cells += [f"{scaled:.0%}", f"max {exact}"]
        print(f"| {label} | " + " | ".join(cells) + " |")
    return results


def main() -> None:
    """``python benchmarks/prep_recipes.py``: the one-process table alone (machine, date and load first)."""
    import argparse
    import datetime
    import os
    import platform

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="rounds (the table shows medians)")
    p.add_argument("--count", type=int, default=96, help="images per round and size")
    p.add_argument("--no-dali", action="store_true", help="leave out DALI's CPU pipeline")
    p.add_argument(
        "--photos", type=int, nargs="?", const=192, default=0, metavar="FILES",
        help="also a row of FILES (default 192) files spread over the photographic dataset of 2000 "
        "(coordl synth --photos, built once under /var/tmp/coordl-bench-data), alternated with the others",
    )  # fmt: skip
    p.add_argument(
        "--held-out", action="store_true",
        help="instead: the three recipes on images not used for tuning (a real photograph, other sizes, "
        "qualities, subsampling, progressive); --count applies per row",
    )  # fmt: skip
    args = p.parse_args()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{now}, {platform.node()}, {os.cpu_count()} cores, load average {os.getloadavg()}")
    if args.held_out:
        held_out_table(args.rounds, args.count)
        print(f"\nload average after: {os.getloadavg()}")
        return
    dali = not args.no_dali
    if dali:
        try:
            import nvidia.dali  # noqa: F401
        except ImportError:
            print("(DALI not installed: its columns are left out)")
            dali = False
    cpu_table(args.rounds, args.count, dali, args.photos)
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()

"""Smoke test of an installed coordl wheel (run by scripts/wheel.sh in a clean virtual env, outside the repo).

Checks what a user of the wheel gets: every package imports from the env's site-packages (not from a source
tree), the crop decoder's C extension loads, a random crop of a JPEG is decoded by it (and the pure-Python
fallback still gives the same shape without it), and the extension's libjpeg resolves to the copy the wheel
carries in ``coordl.libs/`` (auditwheel's renamed one), not to the system's. Prints one line per check; any
failure raises.

Run it with ``python -I`` from a directory that holds no coordl sources.
"""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import sysconfig

import numpy as np
import torch
from PIL import Image

import coordl
import dsanalyzer
import gradcomp
import memcache
import nfs_cache
import shmem

# The module that imports the C extension as ``_cropjpeg`` and exposes ``AVAILABLE`` and ``decode_crop``.
from coordl.prep import cropdecode

SIZE = 32  # the crop's output side: small, the decode is what is checked


def _installed(module) -> str:
    """The module's file, asserted to live in this env's site-packages (so no source tree shadows it)."""
    path = os.path.realpath(module.__file__)
    site = os.path.realpath(sysconfig.get_paths()["platlib"])
    assert path.startswith(site + os.sep), f"{module.__name__} imported from {path}, not from {site}"
    return path


def _jpeg(height: int = 120, width: int = 160) -> bytes:
    """A noisy RGB JPEG made here, so the test needs no data files."""
    pixels = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def check_imports() -> None:
    for module in (coordl, dsanalyzer, gradcomp, memcache, nfs_cache, shmem, cropdecode):
        _installed(module)
    print(f"imports: ok (coordl {coordl.__version__} from {os.path.dirname(_installed(coordl))})")


def check_crop_decode() -> str:
    """The fused Decode + RandomResizedCrop goes through the native decoder; returns the extension's path."""
    assert cropdecode.AVAILABLE, f"the crop decoder did not load: {cropdecode._IMPORT_ERROR}"
    ext = _installed(cropdecode._cropjpeg)
    raw = _jpeg()
    calls = []
    native = cropdecode.decode_crop

    def counted(*args, **kwargs):
        box = native(*args, **kwargs)
        calls.append(box is not None)  # None would mean libjpeg refused and the image was decoded whole
        return box

    cropdecode.decode_crop = counted
    try:
        gen = torch.Generator().manual_seed(0)
        crop = coordl.transforms.Compose(
            [coordl.transforms.Decode(), coordl.transforms.RandomResizedCrop(SIZE, generator=gen)]
        )
        arr = crop(raw)
        tensor = coordl.transforms.train_transform(SIZE)(raw)
    finally:
        cropdecode.decode_crop = native
    assert arr.shape == (SIZE, SIZE, 3) and arr.dtype == np.uint8, (arr.shape, arr.dtype)
    assert tuple(tensor.shape) == (3, SIZE, SIZE), tuple(tensor.shape)
    assert calls == [True, True], f"the native crop decoder was not used for every crop: {calls}"
    print(f"crop decode: ok (native, {arr.shape} and {tuple(tensor.shape)}; {ext})")
    return ext


def check_fallback() -> None:
    """Without the extension the same pipeline decodes whole images and crops them, after one warning."""
    native = cropdecode._cropjpeg
    warnings: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = warnings.append
    logger = logging.getLogger(cropdecode.__name__)
    logger.addHandler(handler)
    logger.propagate = False  # the warning is expected here: keep it off the output
    cropdecode._cropjpeg = None
    try:
        arr = coordl.transforms.Compose(
            [coordl.transforms.Decode(), coordl.transforms.RandomResizedCrop(SIZE)]
        )(_jpeg())
    finally:
        cropdecode._cropjpeg = native
        logger.removeHandler(handler)
        logger.propagate = True
    assert arr.shape == (SIZE, SIZE, 3), arr.shape
    assert [r.levelno for r in warnings] == [logging.WARNING], warnings
    print("fallback without the extension: ok (whole-image decode, one warning)")


def check_vendored_libjpeg(ext: str) -> None:
    """ldd resolves the extension's libjpeg to the wheel's own renamed copy in coordl.libs/."""
    out = subprocess.run(["ldd", ext], capture_output=True, text=True, check=True).stdout
    lines = [line.strip() for line in out.splitlines() if "libjpeg" in line]
    libs = os.path.join(os.path.realpath(sysconfig.get_paths()["platlib"]), "coordl.libs") + os.sep
    assert len(lines) == 1, f"expected one libjpeg in ldd {ext}:\n{out}"
    name, _, target = lines[0].partition(" => ")
    target = os.path.realpath(target.split(" (")[0])
    assert name.startswith("libjpeg-") and target.startswith(libs), (
        f"libjpeg not the vendored copy: {lines[0]}"
    )
    print(f"vendored libjpeg: ok ({name} => {target})")


def main() -> None:
    check_imports()
    ext = check_crop_decode()
    check_fallback()
    check_vendored_libjpeg(ext)
    print(f"wheel smoke test passed (Python {sys.version.split()[0]}, torch {torch.__version__})")


if __name__ == "__main__":
    main()

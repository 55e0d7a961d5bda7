"""GPU prep's rate on the job's own items: a probe the profile runs, which says why not where it cannot.

What ``coordl.dali.DALILoader(device="gpu")`` would do to the job's items (decode on the GPU, a random
resized crop to the job's sample size, a random flip) is done here with ``torchvision.io.decode_jpeg`` on
``cuda`` (nvJPEG, the decoder DALI's ``mixed`` device also uses) over a few hundred of the job's own raw
items, fetched once through its item source and then decoded in batches for a few seconds:

* ``samples_per_s``: decoded + augmented samples per second of wall time, the GPU synchronised at the end;
* ``cpu_s_per_sample``: this thread's CPU per sample meanwhile (wrapping the bytes, launching kernels):
  what GPU prep still costs the cores;
* ``size``: the side the crops were resized to, the job's own sample's (its prep run on one item).

Without a CUDA device, without torchvision, without a coordl item source, or when the items are not JPEG,
the result is ``{"available": False, "why": ...}``: the what-if then says GPU prep is unknown, and why.
:func:`probe_gpu_prep` takes the decoder as an argument (``prep_batch``), so that its bookkeeping runs
in tests on a machine without a GPU.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["probe_gpu_prep", "torchvision_prep", "sample_side"]

PrepBatch = Callable[[Sequence[bytes]], Any]  # raw items -> the batch on the device, synchronised
_JPEG = b"\xff\xd8"
_BATCH = 64


def sample_side(source: Any, raw: bytes, index: int, default: int = 224) -> int:
    """The side of the job's own sample (its prep on one item: the last dimension of a CHW/HWC image)."""
    try:
        sample = source.prep(raw, index)
    except Exception:  # noqa: BLE001 - a user's prep may refuse a lone call; the default size is then used
        return default
    if isinstance(sample, (tuple, list)) and sample:
        sample = sample[0]
    shape = tuple(getattr(sample, "shape", ()) or ())
    if len(shape) >= 2:
        side = int(shape[-1]) if shape[-1] > 4 else int(shape[-2])  # CHW, or HWC with C <= 4
        return side if side > 0 else default
    return default


def torchvision_prep(device: str, size: int, seed: int = 0) -> PrepBatch:
    """Decode with ``torchvision.io.decode_jpeg`` on ``device``, random-resized-crop to ``size``, random flip."""
    import torch
    from torchvision.io import decode_jpeg
    from torchvision.transforms.v2 import functional as tvf

    rng = random.Random(seed)

    def prep_batch(raws: Sequence[bytes]) -> Any:
        data = [torch.frombuffer(bytearray(r), dtype=torch.uint8) for r in raws]
        images = decode_jpeg(data, device=device)
        out = []
        for img in images:
            h, w = int(img.shape[-2]), int(img.shape[-1])
            scale = rng.uniform(0.08, 1.0)  # torchvision's RandomResizedCrop ranges, aspect 1 for brevity
            side = max(1, int(min(h, w) * scale**0.5))
            top, left = rng.randint(0, h - side), rng.randint(0, w - side)
            crop = tvf.resized_crop(img, top, left, side, side, [size, size], antialias=True)
            out.append(tvf.horizontal_flip(crop) if rng.random() < 0.5 else crop)
        batch = torch.stack(out)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return batch

    return prep_batch


def _why_not_here() -> str:
    """Why the GPU probe cannot run on this machine ("" when it can)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    try:
        import torchvision.io  # noqa: F401 - the GPU decoder the probe uses
    except ImportError:
        return "torchvision is not installed (its decode_jpeg on cuda is the probe's GPU decoder)"
    return ""


def probe_gpu_prep(
    source: Any,
    items: int = 256,
    seconds: float = 3.0,
    prep_batch: PrepBatch | None = None,
    device: str = "cuda",
) -> dict:
    """Decode + augment rate of the job's own items on the GPU (``prep_batch``: the decoder; default
    :func:`torchvision_prep` on ``device``, after checking there is a GPU and a decoder)."""
    if prep_batch is None and (why := _why_not_here()):
        return {"available": False, "why": why}
    if source is None or not callable(getattr(source, "fetch", None)):
        return {
            "available": False,
            "why": "the loader's dataset has no coordl item source to read raw items from",
        }
    n = len(source)
    if n == 0:
        return {"available": False, "why": "the dataset has no items"}
    order = random.Random(0).sample(range(n), min(items, n))
    raws: list[bytes] = []
    deadline = time.perf_counter() + seconds  # the job's storage may be slow: fetch for a bounded time
    for i in order:
        raws.append(bytes(source.fetch(i)))
        if time.perf_counter() > deadline and len(raws) >= 8:
            break
    if not all(r[:2] == _JPEG for r in raws):
        return {"available": False, "why": "the job's items are not all JPEG: the GPU decoder needs JPEG"}
    size = sample_side(source, raws[0], order[0])
    prep = prep_batch or torchvision_prep(device, size)
    prep(raws[: min(_BATCH, len(raws))])  # warm-up: CUDA context, nvJPEG handles, kernels
    done, k = 0, 0
    cpu0, t0 = time.thread_time(), time.perf_counter()
    while done < 2 * len(raws) or time.perf_counter() - t0 < seconds:
        batch = [raws[(k + j) % len(raws)] for j in range(_BATCH)]
        prep(batch)
        done, k = done + len(batch), k + len(batch)
        if time.perf_counter() - t0 > 4 * seconds:
            break
    wall, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
    return {
        "available": True,
        "samples_per_s": done / wall,
        "cpu_s_per_sample": cpu / done,
        "size": size,
        "items": len(raws),
        "samples": done,
        "decoder": "torchvision.io.decode_jpeg"
        if prep_batch is None
        else getattr(prep_batch, "__name__", "given"),
        "device": device,
    }

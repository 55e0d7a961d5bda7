"""``coordl.DataLoader(pin_memory=True)`` + ``.to("cuda", non_blocking=True)`` against torch's DataLoader.

The same job for every loader: 4 workers turn items into 3x224x224 float32 samples (cheap prep, so the
host-to-device path is what differs), batches of 64 (38.5 MB), then each batch goes to the GPU with
``non_blocking=True`` and a small kernel reads it. Per batch it records the wait for the loader, the host
time of the ``.to()`` call (near zero when the copy is really asynchronous, i.e. from pinned memory)
and the copy's device time between two CUDA events. coordl runs with its batch ring on (workers
collate into shared-memory slots; the main process copies a slot into pinned memory) and off
(torch's pin-memory thread pins the batch). Configurations alternate within each round; medians.
"""

from __future__ import annotations

import statistics
import time

from gpu.common import Context, fmt

TITLE = "pin_memory and non_blocking copies: coordl.DataLoader vs torch's DataLoader"
BUDGET_S = 75
SHAPE = (3, 224, 224)
# name -> (label, coordl options, pin_memory on a GPU); the last one is what pinning buys: a pageable source
CONFIGS = {
    "torch": ("torch DataLoader", {}, True),
    "coordl_ring": ("coordl.DataLoader, batch ring on", {"batch_ring": True}, True),
    "coordl_noring": ("coordl.DataLoader, batch ring off", {"batch_ring": False}, True),
    "coordl_nopin": ("coordl.DataLoader, batch ring on, pin_memory=False", {"batch_ring": True}, False),
}


class Items:
    """n items of raw bytes (one shared random image) made into float tensors: fetch + prep, or getitem."""

    def __init__(self, n: int, shape: tuple[int, ...]) -> None:
        import numpy as np

        self.n, self.shape = n, shape
        self.raw = (
            np.random.default_rng(0).integers(0, 255, size=int(np.prod(shape)), dtype=np.uint8).tobytes()
        )

    def __len__(self) -> int:
        return self.n

    def fetch(self, index: int) -> bytes:
        return self.raw

    def prep(self, raw: bytes, index: int):
        import torch

        x = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(self.shape).float().div_(255)
        return x, index % 10

    def __getitem__(self, index: int):
        return self.prep(self.fetch(index), index)


def _loader(cfg: str, data: Items, batch: int, pin: bool):
    import torch

    import coordl

    common = dict(batch_size=batch, num_workers=4, pin_memory=pin, drop_last=True, prefetch_factor=2)
    if cfg == "torch":
        return torch.utils.data.DataLoader(data, **common)
    return coordl.DataLoader(data, **CONFIGS[cfg][1], **common)


def measure(cfg: str, data: Items, batch: int, device: str, warmup: int = 4) -> dict:
    """One pass of a loader: per-batch wait, .to() host time, copy device time; samples/s."""
    import torch

    cuda = device == "cuda"
    loader = _loader(cfg, data, batch, pin=cuda and CONFIGS[cfg][2])
    waits, issue, events, pinned = [], [], [], 0
    t_start, n = None, 0
    it = iter(loader)
    t0 = time.perf_counter()
    for i, (x, y) in enumerate(it):
        t1 = time.perf_counter()
        if i == warmup:
            t_start, n = t1, 0
        pinned += int(x.is_pinned()) if cuda else 0
        start, end = (
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            if cuda
            else (None, None)
        )
        if cuda:
            start.record()
        xg, yg = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if cuda:
            end.record()
        t2 = time.perf_counter()
        xg.sum()  # a kernel that reads the batch, queued behind the copy
        if i >= warmup:
            waits.append(t1 - t0)
            issue.append(t2 - t1)
            events.append((start, end))
            n += len(yg)
        t0 = time.perf_counter()
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t_start
    if hasattr(loader, "close"):
        loader.close()
    copy_ms = [s.elapsed_time(e) for s, e in events] if cuda else [1e3 * t for t in issue]
    return {"rate": n / elapsed, "wait_ms": 1e3 * statistics.median(waits), "issue_ms": 1e3 * statistics.median(issue),
            "copy_ms": statistics.median(copy_ms), "pinned": pinned, "batches": len(waits) + warmup}  # fmt: skip


def run(ctx: Context) -> None:
    n, batch, rounds, shape = (96, 8, 1, (3, 32, 32)) if ctx.dry else (1536, 64, 3, SHAPE)
    data = Items(n, shape)
    ctx.command(
        f"scripts/gpu/pin.py measure(cfg, Items({n}, {shape}), batch={batch}, device={ctx.device}) x {rounds}"
    )
    res: dict[str, list[dict]] = {c: [] for c in CONFIGS}
    names = list(CONFIGS)
    for r in range(rounds):
        for cfg in names[r % len(names) :] + names[: r % len(names)]:
            res[cfg].append(measure(cfg, data, batch, ctx.device))
    mb = batch * 4 * shape[0] * shape[1] * shape[2] / 1e6
    rows = []
    for cfg, runs in res.items():
        med = {k: statistics.median(x[k] for x in runs) for k in ("rate", "wait_ms", "issue_ms", "copy_ms")}
        pinned = f"{sum(x['pinned'] for x in runs)}/{sum(x['batches'] for x in runs)}"
        rows.append([CONFIGS[cfg][0], fmt(med["rate"], 0), fmt(med["wait_ms"], 2), fmt(med["issue_ms"], 3),
                     fmt(med["copy_ms"], 3), fmt(mb / med["copy_ms"], 1) if med["copy_ms"] else "-", pinned])  # fmt: skip
    ctx.table(
        f"{batch} x {shape} float32 = {mb:.1f} MB per batch, 4 workers, pin_memory={ctx.device == 'cuda'} unless said, "
        f"medians of {rounds} rounds (per batch)",
        ["loader", "samples/s", "wait ms", ".to() host ms", "H2D copy ms", "GB/s", "pinned batches"],
        rows,
        note="'.to() host ms' near zero: the copy was queued asynchronously (pinned source; from pageable memory "
        "`.to(non_blocking=True)` copies synchronously). "
        "'H2D copy ms' is the copy's device time between CUDA events (on the CPU: the host time).",
    )

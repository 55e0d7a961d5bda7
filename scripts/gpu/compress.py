"""MSTopK and gradcomp's compressors on CUDA, beside ``torch.topk``.

MSTopK's table comes from ``benchmarks/bench_mstopk.py``'s own ``bench`` (the method of
reports/bench_gradcomp.md: median of ``reps`` after a warm-up, synchronised, with recall of the exact
top-k). The compressor table times each method's compress and decompress of one gradient-sized tensor
(25M fp32 elements, about ResNet-50's gradient) as the DDP hook would call them.
"""

from __future__ import annotations

import statistics
import sys
import time

from gpu.common import Context, fmt

TITLE = "MSTopK and the gradient compressors on CUDA"
BUDGET_S = 60
METHODS = ("topk", "mstopk", "randomk", "qsgd", "terngrad", "signsgd", "fp16", "bf16")


def _timed(fn, device, reps: int) -> float:
    """Median seconds of ``fn`` over ``reps`` calls after one warm-up, the device synchronised."""
    import torch

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def mstopk_table(ctx: Context, device, dry: bool) -> None:
    sys.path.insert(0, str(ctx.root / "benchmarks"))
    import bench_mstopk

    sizes, reps = ([10_000, 100_000], 2) if dry else ([1_000_000, 10_000_000, 100_000_000], 5)
    ctx.command(f"benchmarks/bench_mstopk.py bench(device={device.type}, sizes={sizes}, reps={reps})")
    rows = bench_mstopk.bench(device, sizes, [0.001, 0.01], reps, sort_max=10_000_000)
    ctx.table(
        f"MSTopK vs torch.topk on {device.type} (ms, median of {reps})",
        ["elements", "density", "full sort ms", "torch.topk ms", "MSTopK ms", "topk / MSTopK", "MSTopK recall"],
        [[f"{r['n']:.0e}", r["density"], fmt(r["sort_ms"], 2), fmt(r["topk_ms"], 2), fmt(r["mstopk_ms"], 2),
          fmt(r["speedup_vs_topk"], 2), f"{r['recall']:.4f}"] for r in rows],
    )  # fmt: skip


def _compressor_row(comp, g, device, reps: int) -> list[str]:
    payload, cctx = comp.compress(g, "grad")
    sent = sum(t.numel() * t.element_size() for t in payload)
    t_c = _timed(lambda: comp.compress(g, "grad"), device, reps)
    t_d = _timed(lambda: comp.decompress(payload, cctx), device, reps)
    out = comp.decompress(payload, cctx)
    if out.device != g.device:
        raise RuntimeError(f"decompressed on {out.device}, not {g.device}")
    err = (out - g).norm() / g.norm()
    return [fmt(1e3 * t_c, 2), fmt(1e3 * t_d, 2), fmt(g.numel() * 4 / sent, 1), f"{float(err):.3f}"]


def compressor_table(ctx: Context, device, dry: bool) -> None:
    import torch

    from gradcomp import get_compressor

    n, reps = (50_000, 2) if dry else (25_000_000, 5)
    g = torch.randn(n, generator=torch.Generator().manual_seed(0)).to(device)
    rows = []
    for name in METHODS:
        try:
            rows.append([name, *_compressor_row(get_compressor(name, 0.01), g, device, reps)])
        except Exception as e:  # noqa: BLE001 - one method failing on CUDA is a finding, not the end of the table
            rows.append([name, f"FAILED: {type(e).__name__}: {str(e)[:100]}", "-", "-", "-"])
    ctx.table(
        f"Compressors on {device.type}: one {n / 1e6:g}M-element fp32 gradient, ratio 0.01 (ms, median of {reps})",
        ["method", "compress ms", "decompress ms", "bytes ratio", "relative error"],
        rows,
    )  # fmt: skip


def run(ctx: Context) -> None:
    import torch

    device = torch.device(ctx.device)
    mstopk_table(ctx, device, ctx.dry)
    compressor_table(ctx, device, ctx.dry)
    if device.type == "cuda":
        ctx.note(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}.")

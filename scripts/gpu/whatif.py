"""The what-if's GPU axis (``dsanalyzer whatif --gpu-speedup``) against runs with lighter models.

A lighter model on the same GPU is what a faster GPU looks like to the data path: the same loader, a
shorter step. The section times the training step of the CNN of scripts/gpu/train_job.py at several
widths on random tensors (seconds), profiles the widest one whose step is at most ``MAX_STEP_S`` (the
*heavy* job), and from its measured prep rate picks two narrower ones: a *medium* job that should stay
compute-bound (compute rate near 0.6x prep) and a *light* one that should not (compute at 2x prep or
more). It profiles both, asks ``dsanalyzer whatif --gpu-speedup S`` on the heavy profile, and compares
with each one's measured samples/s (its profile's real run). S comes two ways: the step micro-benchmark
(what a user would have) and the profiles' compute-alone rates. The choice adapts to the GPU and the
cores, which nobody here could measure in advance.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import time

from gpu.common import Context, SectionError, cli_argv, fmt
from gpu.train_job import build_model, make_step

TITLE = "dsanalyzer whatif: the GPU axis against lighter models"
BUDGET_S = 200
CPUS = 4
MAX_STEP_S = 0.15
WIDTHS, BLOCKS = (512, 384, 256, 192, 128, 96, 64, 32), 8
DRY_WIDTHS, DRY_BLOCKS = (16, 4), 2  # heavy and light (the medium is chosen by the same code as the light)


def step_seconds(width: int, blocks: int, device: str, batch: int, size: int, reps: int = 15) -> float:
    """Median seconds of the model's training step on a random batch on the device (after 3 warm-ups)."""
    import torch

    torch.manual_seed(0)
    step = make_step(build_model(width, blocks, 10).to(device), device)
    x, y = torch.randn(batch, 3, size, size, device=device), torch.randint(0, 10, (batch,), device=device)
    for _ in range(3):
        step(x, y)
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step(x, y)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def choose(times: dict[int, float], heavy: int, batch: int, prep_rate: float) -> dict[str, int]:
    """The medium and light widths for a heavy job whose loader preps ``prep_rate`` samples/s."""
    narrower = [w for w in times if w < heavy and times[w] < times[heavy] / 1.3]
    out = {}
    medium = [w for w in narrower if batch / times[w] < 0.8 * prep_rate]
    if medium:
        out["medium"] = min(medium, key=lambda w: abs(batch / times[w] - 0.6 * prep_rate))
    light = [w for w in narrower if batch / times[w] >= 2 * prep_rate and w != out.get("medium")]
    rest = [w for w in narrower if w != out.get("medium")]
    if light or rest:
        out["light"] = max(light) if light else min(rest)
    return out


def _profile(ctx: Context, width: int, blocks: int, job: list[str], iters: list[str]) -> dict:
    out = ctx.work / f"width-{width}"
    argv = [*cli_argv("dsanalyzer"), "profile", *iters, "--quiet", "--out", str(out), "--", sys.executable,
            "scripts/gpu/train_job.py", "--width", str(width), "--blocks", str(blocks), *job]  # fmt: skip
    ctx.run(argv, timeout=ctx.share(0.32), cpus=CPUS)
    return json.loads((out / "report.json").read_text())


def _predict(ctx: Context, width: int, speedup: float) -> float:
    report = ctx.work / f"width-{width}" / "report.json"
    out = ctx.run(
        [*cli_argv("dsanalyzer"), "whatif", str(report), "--gpu-speedup", f"{speedup:.4g}"], timeout=60
    )
    last = out.strip().splitlines()[-1]
    if not last.startswith("predicted_samples_per_s="):
        raise SectionError(f"dsanalyzer whatif printed no prediction: {last!r}")
    return float(last.split("=", 1)[1])


def _error(measured: float | None, predicted: float | None) -> str:
    """Measured vs predicted, flagged past the 10% target."""
    if not measured or not predicted:
        return "-"
    err = (measured - predicted) / predicted
    return f"{err:+.1%}" + ("" if abs(err) <= 0.10 else " (over 10%)")


def _row(ctx: Context, role: str, width: int, t: dict, rep: dict, heavy: tuple[int, dict]) -> list[str]:
    rates = rep.get("rates_per_s") or {}
    row = [role, width, fmt(1e3 * t[width], 2), rep.get("bound", "-")]
    row += [fmt(rates.get(k), 0) for k in ("compute", "prep", "observed")]
    own = _predict(ctx, width, 1.0)  # the job's own profile's prediction: what its loader's rates give
    if width == heavy[0]:  # the model's own error at the measured point, for scale
        return row + ["1", "1", fmt(own), _error(rates.get("observed"), own), "-", "-", fmt(own), "-"]
    s_micro = t[heavy[0]] / t[width]
    heavy_compute = (heavy[1].get("rates_per_s") or {}).get("compute")
    s_prof = rates["compute"] / heavy_compute if rates.get("compute") and heavy_compute else None
    measured = rates.get("observed")
    cells = [fmt(s_micro, 2)]
    for s in (s_micro, s_prof):
        pred = _predict(ctx, heavy[0], s) if s else None
        cells += [fmt(pred), _error(measured, pred)]
    # The heavy profile at S against the light job's own: apart from S they differ only by the loader's
    # rates as measured at another time (on a shared machine, the part S does not predict).
    return row + cells[:1] + [fmt(s_prof, 2)] + cells[1:] + [fmt(own), _error(pred, own)]


def run(ctx: Context) -> None:
    import coordl

    dry = ctx.dry
    n, batch, size, workers = (64, 8, 32, 2) if dry else (1200, 64, 96, CPUS)
    widths, blocks = (DRY_WIDTHS, DRY_BLOCKS) if dry else (WIDTHS, BLOCKS)
    data = coordl.synth.make_dataset(ctx.work / "data", n, 10, width=320, height=240)
    job = [
        "--data",
        str(data),
        "--device",
        ctx.device,
        "--size",
        str(size),
        "-b",
        str(batch),
        "--workers",
        str(workers),
    ]
    iters = (
        ["--iters", "4", "--warmup", "1"] if dry else ["--iters", "30", "--warmup", "3", "--min-seconds", "3"]
    )
    ctx.command(
        f"scripts/gpu/whatif.py step_seconds(width, {blocks}, {ctx.device}, batch={batch}, size={size})"
    )
    t = {w: step_seconds(w, blocks, ctx.device, batch, size, reps=3 if dry else 15) for w in widths}
    ctx.note(
        "Step of a random batch by width (ms): " + ", ".join(f"{w}: {1e3 * s:.2f}" for w, s in t.items())
    )
    heavy = widths[0] if dry else max([w for w in widths if t[w] <= MAX_STEP_S] or [min(widths)])
    reports = {heavy: _profile(ctx, heavy, blocks, job, iters)}
    prep = (reports[heavy].get("rates_per_s") or {}).get("prep") or 0.0
    # the dry run's CPU timings are noise: it takes the narrowest width as the light job (medium is the same code)
    roles = {"heavy": heavy, **({"light": widths[-1]} if dry else choose(t, heavy, batch, prep))}
    if (reports[heavy].get("bound") or "") != "compute":
        ctx.note(f"The heavy job (width {heavy}) is {reports[heavy].get('bound')}-bound, not compute-bound: the "
                 "GPU axis is only exercised by how little a faster step changes.")  # fmt: skip
    for w in roles.values():
        if w in reports:
            continue
        if dry:  # the wiring only: the heavy profile stands in for the light one (a second is the same code)
            (ctx.work / f"width-{w}").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(
                ctx.work / f"width-{heavy}" / "report.json", ctx.work / f"width-{w}" / "report.json"
            )
            reports[w] = reports[heavy]
        else:
            reports[w] = _profile(ctx, w, blocks, job, iters)
    rows = [_row(ctx, role, w, t, reports[w], (heavy, reports[heavy])) for role, w in roles.items()]
    preps = ", ".join(fmt((reports[w].get("rates_per_s") or {}).get("prep"), 0) for w in roles.values())
    ctx.note(f"The same loader's prep rate as each profile measured it: {preps} samples/s. S moves the step and "
             "its CPU (CUDA's wait spins); the loader's rates come from the heavy profile, so its spread from "
             "the others' is the part of the error S does not predict ('S profiles vs own').")  # fmt: skip
    ctx.table(
        f"whatif --gpu-speedup S on the heavy job's profile vs lighter jobs measured: batch {batch}, {size}px crops, "
        f"{blocks} conv blocks, {workers} workers on {CPUS} cores",
        ["job", "width", "step ms", "bound", "compute/s", "prep/s", "measured/s", "S (step)", "S (profiles)",
         "predicted/s (S step)", "error", "predicted/s (S profiles)", "error", "own profile predicts/s",
         "S profiles vs own"],
        rows,
    )  # fmt: skip

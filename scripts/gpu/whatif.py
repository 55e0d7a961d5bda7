"""The what-if's GPU axis (``dsanalyzer whatif --gpu-speedup``) against a run with a lighter model.

A lighter model on the same GPU is what a faster GPU looks like to the data path: the same loader, a
shorter step. The section profiles the heavy job (scripts/gpu/train_job.py, compute-bound by design),
measures how much faster the light model's step is, asks ``dsanalyzer whatif --gpu-speedup S`` for the
heavy profile's samples/s at that speed-up, and compares with the light job's measured samples/s
(its own profile's real run). S comes two ways: a micro-benchmark of the two steps on random tensors
(what a user would have) and the two profiles' compute-alone rates.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from gpu.common import Context, SectionError, cli_argv, fmt
from gpu.train_job import build_model, make_step

TITLE = "dsanalyzer whatif: the GPU axis against a lighter model"
BUDGET_S = 180
CPUS = 4


def step_seconds(name: str, device: str, batch: int, size: int, dry: bool, reps: int = 20) -> float:
    """Median seconds of the model's training step on a random batch (after 5 warm-up steps)."""
    import torch

    torch.manual_seed(0)
    model = build_model(name, 10, dry).to(device)
    step = make_step(model, device)
    x, y = torch.randn(batch, 3, size, size, device=device), torch.randint(0, 10, (batch,), device=device)
    for _ in range(5):
        step(x, y)
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step(x, y)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def _profile(ctx: Context, model: str, data, job: list[str], iters: list[str]) -> dict:
    out = ctx.work / model
    argv = [*cli_argv("dsanalyzer"), "profile", *iters, "--quiet", "--out", str(out), "--",
            sys.executable, "scripts/gpu/train_job.py", "--data", str(data), "--model", model, *job]  # fmt: skip
    ctx.run(argv, timeout=BUDGET_S * 0.45, cpus=CPUS)
    return json.loads((out / "report.json").read_text())


def _predict(ctx: Context, report_dir, speedup: float) -> float:
    out = ctx.run([*cli_argv("dsanalyzer"), "whatif", str(report_dir / "report.json"), "--gpu-speedup", f"{speedup:.4g}"],
                  timeout=60)  # fmt: skip
    last = out.strip().splitlines()[-1]
    if not last.startswith("predicted_samples_per_s="):
        raise SectionError(f"dsanalyzer whatif printed no prediction: {last!r}")
    return float(last.split("=", 1)[1])


def run(ctx: Context) -> None:
    from coordl.data.synth import make_dataset

    dry = ctx.dry
    n, batch, size, workers = (96, 8, 32, 2) if dry else (1200, 64, 96, CPUS)
    data = make_dataset(ctx.work / "data", n, 10, width=320, height=240)
    job = ["--device", ctx.device, "--size", str(size), "-b", str(batch), "--workers", str(workers)]
    job += ["--dry"] if dry else []
    iters = ["--iters", "6", "--warmup", "2"] if dry else ["--iters", "40", "--warmup", "5", "--min-seconds", "3"]
    t = {m: step_seconds(m, ctx.device, batch, size, dry) for m in ("heavy", "light")}
    ctx.command(f"scripts/gpu/whatif.py step_seconds(model, {ctx.device}, batch={batch}, size={size})")
    reports = {m: _profile(ctx, m, data, job, iters) for m in ("heavy", "light")}
    rates = {m: reports[m].get("rates_per_s") or {} for m in reports}
    ctx.table(
        f"The two jobs: batch {batch}, {size}px crops, {workers} workers on {CPUS} cores",
        ["model", "step ms (random batch)", "profile: bound", "compute/s", "prep/s", "fetch/s", "observed/s"],
        [[m, fmt(1e3 * t[m], 2), reports[m].get("bound", "-")]
         + [fmt(rates[m].get(k), 0) for k in ("compute", "prep", "fetch", "observed")] for m in reports],
    )  # fmt: skip
    measured = rates["light"].get("observed")
    speedups = {"step micro-benchmark": t["heavy"] / t["light"]}
    if rates["heavy"].get("compute") and rates["light"].get("compute"):
        speedups["the profiles' compute rates"] = rates["light"]["compute"] / rates["heavy"]["compute"]
    rows = []
    for source, s in speedups.items():
        pred = _predict(ctx, ctx.work / "heavy", s)
        err = (measured - pred) / pred if measured and pred else None
        rows.append([source, fmt(s, 2), fmt(pred), fmt(measured), f"{err:+.1%}" if err is not None else "-",
                     "yes" if err is not None and abs(err) <= 0.10 else "NO"])  # fmt: skip
    ctx.table(
        "whatif --gpu-speedup S on the heavy job's profile vs the light job measured",
        ["S from", "S", "predicted/s", "light measured/s", "error", "within 10%"],
        rows,
    )

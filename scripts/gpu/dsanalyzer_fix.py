"""dsanalyzer on a real GPU job: profile, apply the verdict's fix, verify it (target: within 10%).

This is ``dsanalyzer demo`` through the public CLI: the project's CNN (forward/backward on CUDA when
there is one; the demo picks the GPU by itself) fed by ``coordl.DataLoader`` over a synthetic dataset
on emulated slow storage (reads rate-limited in user space, no page cache). The demo profiles it,
takes the change the verdict names (a MinIO cache), runs the changed job ``--verify-runs`` times and
records the prediction against the measured median in its report.json, which this section tabulates.

The job is confined to ``CPUS`` cores: the profile measures prep at 1..cores workers, and 16 of them
would take minutes; 4 cores is also what a GPU's share of a shared server often is.
"""

from __future__ import annotations

import json

from gpu.common import Context, SectionError, cli_argv, fmt

TITLE = "dsanalyzer: profile a GPU training job on throttled storage, apply the fix, verify"
BUDGET_S = 210
CPUS = 4


def summarise(ctx: Context, report: dict, label: str) -> None:
    """The profile's rates and verdict, and the verify entry if there is one."""
    rates, per = report.get("rates_per_s") or {}, report.get("per_iter_s") or {}
    verdict = report.get("verdict") or {}
    ctx.table(
        f"{label}: the profile ({report.get('bound', '?')}-bound)",
        ["compute/s", "prep/s", "fetch/s", "observed/s", "compute ms/iter", "fetch stall ms/iter", "prep stall ms/iter"],
        [[fmt(rates.get(k), 0) for k in ("compute", "prep", "fetch", "observed")]
         + [fmt(1e3 * per[k], 2) if isinstance(per.get(k), (int, float)) else "-"
            for k in ("compute", "fetch_stall", "prep_stall")]],
        note=str(verdict.get("sentence") or ""),
    )  # fmt: skip
    v = report.get("verify")
    if not v:
        return
    lo, hi = v.get("measured_range") or (None, None)
    ctx.table(
        f"{label}: the fix applied and verified",
        ["change", "predicted/s", "bound", "measured median/s", "runs' range", "error", "within 10%"],
        [[json.dumps(v.get("change")), fmt(v.get("predicted_samples_per_s")), v.get("predicted_bound", "-"),
          fmt(v.get("measured_samples_per_s")), f"{fmt(lo)}-{fmt(hi)}",
          f"{v['error']:+.1%}" if isinstance(v.get("error"), float) else "-",
          "yes" if v.get("within_target") else "NO"]],
        note=str(v.get("note") or ""),
    )  # fmt: skip


def run(ctx: Context) -> None:
    out = ctx.work / "demo"
    if ctx.dry:  # tiny: the wiring, not the numbers (an emulated 30 ms step on the CPU)
        size = [
            "--items",
            "160",
            "--iters",
            "8",
            "--verify-runs",
            "1",
            "--min-seconds",
            "0",
            "--storage-mbps",
            "3",
        ]
    else:
        size = [
            "--items",
            "800",
            "--iters",
            "40",
            "--verify-runs",
            "3",
            "--min-seconds",
            "5",
            "--storage-mbps",
            "3",
        ]
    ctx.run(
        [*cli_argv("dsanalyzer"), "demo", "--out", str(out), "--quiet", *size],
        timeout=ctx.remaining(),
        cpus=CPUS,
    )
    path = out / "report.json"
    if not path.exists():
        raise SectionError(f"dsanalyzer demo wrote no {path}")
    report = json.loads(path.read_text())
    machine = report.get("machine") or {}
    for key in ("compute_note", "storage_note"):
        if machine.get(key):
            ctx.note(f"{key.split('_')[0].capitalize()}: {machine[key]}.")
    summarise(ctx, report, "dsanalyzer demo")
    if not report.get("verify"):
        if ctx.dry:  # the wiring ran; a tiny CPU demo on a busy machine may name no fix (its cores bind)
            ctx.note("Dry run: the verdict named no fix here, so nothing was verified (the wiring ran).")
            return
        raise SectionError("the demo's report has no verify entry (the verdict named no fix?)")

"""Closing the loop: ``dsanalyzer fix`` and ``coordl.DataLoader(tune=True)`` against a grid search of the knobs.

Four training jobs, each a plain torch script with its user's own loader settings (the "user" column):

* ``fetch``: items read from files through storage that answers each read after 5 ms (emulated: a sleep
  per read, as a network file system or a busy disk would), 2 workers; the step is light;
* ``prep``: the README's dataset and transform (JPEG decode, random crop, flip) on 1 worker;
* ``compute``: items from memory, a step of dense layers that takes longer than the items' prep;
* ``readme``: the README's job as written (2 workers, torch's default intra-op threads) on 2 cores.

For each job:

1. **grid**: every point of ``num_workers x prefetch_factor x the trainer's intra-op threads`` (torch's
   default, or 1), each a run of ``--epochs`` epochs, samples/s from the second epoch on; the grid's best
   point and the wall time the whole grid took;
2. **fix**: ``dsanalyzer fix -- python job.py`` (``--runs 1``), its wall time, and the change it kept;
   **online**: ``dsanalyzer fix --online -- python job.py`` (one run of the job tuning itself), the same;
3. **final**: the user's settings, the grid's best, fix's and online's kept changes (a configuration that is
   the same knobs as one before it is run once: the same runs count for both) and **tune**, the job with
   ``coordl.DataLoader(..., tune=True)`` for ``--tune-epochs`` epochs (each epoch's samples/s and
   ``tune_log()``; its rate from epoch 2 is the median of epochs 2 on), alternated ``--runs`` times (the
   same minutes of a shared host for each), medians.

The targets (issue 60): fix reaches >= 90% of the grid's best in under a fifth of the grid's time; tune
reaches >= 90% of it from its second epoch; neither ends below the user's settings by more than 2%. The
profile's fix costs at least six runs of the job (the profile's four, two per round): 0.5x a 12-point grid
at best; ``--online`` is the one that can finish in under a fifth.

    .venv/bin/python benchmarks/bench_fix.py [--jobs fetch prep compute readme] [--runs 3]

Writes ``reports/runs/bench_fix.json``; prints one table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
DSANALYZER = str(Path(PY).with_name("dsanalyzer"))

# One script for every job: its kind and the data's folder on the command line; the knobs of a grid point
# in BENCH_* variables (unset: the user's own settings, the ones dsanalyzer fix starts from).
JOB = r'''
import json, os, sys, time
import torch
import coordl

kind, root = sys.argv[1], sys.argv[2]
USER = {"fetch": (2, 2), "prep": (1, 2), "compute": (2, 2), "readme": (2, 2)}[kind]
workers = int(os.environ.get("BENCH_WORKERS", USER[0]))
prefetch = int(os.environ.get("BENCH_PREFETCH", USER[1]))
if int(os.environ.get("BENCH_THREADS", "0")):
    torch.set_num_threads(int(os.environ["BENCH_THREADS"]))
extra = json.loads(os.environ.get("BENCH_LOADER_ARGS", "{}"))
tune = os.environ.get("BENCH_TUNE") == "1"
Loader = coordl.DataLoader if tune or os.environ.get("BENCH_LOADER") == "coordl" else torch.utils.data.DataLoader
if tune:
    extra["tune"] = True
epochs = int(os.environ.get("BENCH_EPOCHS", "3"))


class SlowReads(torch.utils.data.Dataset):
    """Each read answered after 5 ms (emulated remote storage); the bytes' sum as the sample."""
    def __init__(self, files):
        self.files = files
    def __len__(self):
        return len(self.files)
    def __getitem__(self, i):
        with open(self.files[i], "rb") as f:
            raw = f.read()
        time.sleep(0.005)
        return torch.tensor(float(len(raw))).expand(64).clone(), i % 10


if kind == "fetch":
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".jpg"))
    data, batch = SlowReads(files), 32
    model = torch.nn.Sequential(torch.nn.Linear(64, 10))
elif kind == "compute":
    data, batch = torch.utils.data.TensorDataset(torch.randn(2048, 512), torch.randint(0, 10, (2048,))), 64
    model = torch.nn.Sequential(*[m for _ in range(6) for m in (torch.nn.Linear(512, 512), torch.nn.ReLU())],
                                torch.nn.Linear(512, 10))
else:
    data, batch = coordl.ImageFolder(root, transform=coordl.transforms.train_transform(64)), 32
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(16, len(data.classes)))
loader = Loader(data, batch_size=batch, shuffle=True, num_workers=workers, prefetch_factor=prefetch,
                persistent_workers=True, **extra)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
rates = []
for epoch in range(epochs):
    t, n = time.perf_counter(), 0
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        n += len(y)
    rates.append(n / (time.perf_counter() - t))
log = loader.tune_log() if hasattr(loader, "tune_log") else []
print("BENCH " + json.dumps({"rates": rates, "tune_log": log}), flush=True)
'''

JOBS = ("fetch", "prep", "compute", "readme")
USER = {"fetch": (2, 2), "prep": (1, 2), "compute": (2, 2), "readme": (2, 2)}  # as in JOB: workers, prefetch
GRID = {"prefetch": (2, 4), "threads": (0, 1)}  # threads 0: torch's default


def _run_job(
    script: Path, kind: str, root: str, env_extra: dict[str, str], timeout: float = 600
) -> dict[str, Any]:
    env = {**os.environ, **env_extra}
    t = time.perf_counter()
    out = subprocess.run(
        [PY, str(script), kind, root], env=env, capture_output=True, text=True, timeout=timeout
    )
    wall = time.perf_counter() - t
    for line in out.stdout.splitlines():
        if line.startswith("BENCH "):
            got = json.loads(line[6:])
            got["wall_s"] = wall
            return got
    raise RuntimeError(
        f"bench_fix: job {kind} {env_extra} printed no result:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    )


def _steady(rates: list[float]) -> float:
    return statistics.median(rates[1:] if len(rates) > 1 else rates)


def _point_env(point: dict[str, int], epochs: int) -> dict[str, str]:
    env = {
        "BENCH_WORKERS": str(point["workers"]),
        "BENCH_PREFETCH": str(point["prefetch"]),
        "BENCH_EPOCHS": str(epochs),
    }
    if point["threads"]:
        env["BENCH_THREADS"] = str(point["threads"])
    return env


def _fix_env(fix: dict[str, Any], epochs: int) -> dict[str, str]:
    """The change ``dsanalyzer fix`` kept, as the job's BENCH_* settings."""
    kept = fix.get("kept") or {}
    env = {"BENCH_EPOCHS": str(epochs)}
    args = dict(kept.get("loader_args") or {})
    if "num_workers" in args:
        env["BENCH_WORKERS"] = str(args.pop("num_workers"))
    if "prefetch_factor" in args:
        env["BENCH_PREFETCH"] = str(args.pop("prefetch_factor"))
    if kept.get("torch_threads"):
        env["BENCH_THREADS"] = str(kept["torch_threads"])
    if kept.get("switch_to") or args:
        env["BENCH_LOADER"] = "coordl"
    if args:
        env["BENCH_LOADER_ARGS"] = json.dumps(args)
    return env


def bench_job(kind: str, script: Path, root: str, args: argparse.Namespace) -> dict[str, Any]:
    grid: list[dict[str, Any]] = []
    t = time.perf_counter()
    for w, p, th in itertools.product(args.workers, GRID["prefetch"], GRID["threads"]):
        point = {"workers": w, "prefetch": p, "threads": th}
        got = _run_job(script, kind, root, _point_env(point, args.epochs))
        grid.append({**point, "samples_per_s": _steady(got["rates"])})
        print(f"  [{kind}] grid {point}: {grid[-1]['samples_per_s']:.0f} samples/s", flush=True)
    grid_s = time.perf_counter() - t
    best = max(grid, key=lambda g: g["samples_per_s"])
    fix, fix_s = _fix(
        kind, script, root, ["--profile-iters", str(args.profile_iters), "--iters", str(args.fix_iters)]
    )
    print(f"  [{kind}] fix kept {fix.get('kept')} in {fix_s:.0f} s (grid {grid_s:.0f} s)", flush=True)
    online, online_s = _fix(kind, script, root, ["--online"])
    print(f"  [{kind}] fix --online kept {online.get('kept')} in {online_s:.0f} s", flush=True)
    tune_env = {"BENCH_TUNE": "1", "BENCH_EPOCHS": str(args.tune_epochs)}
    configs = {
        "user": {"BENCH_EPOCHS": str(args.epochs)},
        "grid_best": _point_env(best, args.epochs),
        "fix": _fix_env(fix, args.epochs),
        "online": _fix_env(online, args.epochs),
    }
    alias: dict[str, str] = {}  # a configuration with the knobs of one before it: one set of runs for both
    names = list(configs)
    for i, name in enumerate(names[2:], 2):
        same = (
            o
            for o in names[:i]
            if not alias.get(o) and _knobs(kind, configs[o]) == _knobs(kind, configs[name])
        )
        alias[name] = next(same, "")
    for name, same_as in alias.items():
        if same_as:
            del configs[name]
    final: dict[str, list[float]] = {k: [] for k in (*configs, "tune_from_epoch2", "tune_last")}
    tunes = []
    for _ in range(args.runs):  # tune alternated with the others too: the same minutes of the host
        for name, env in configs.items():
            final[name].append(_steady(_run_job(script, kind, root, env)["rates"]))
        tunes.append(_run_job(script, kind, root, tune_env))
        final["tune_from_epoch2"].append(_steady(tunes[-1]["rates"]))
        final["tune_last"].append(tunes[-1]["rates"][-1])
        print(f"  [{kind}] tune epochs {[round(r) for r in tunes[-1]['rates']]}", flush=True)
    for name, same_as in alias.items():
        if same_as:
            final[name] = final[same_as]
    med = {k: statistics.median(v) for k, v in final.items()}
    return {
        "grid": grid, "grid_best": best, "grid_s": grid_s, "fix_s": fix_s, "fix": fix, "tune": tunes,
        "fix_is_grid_best": alias["fix"] == "grid_best", "final": final, "median": med, "aliases": alias,
        "fix_vs_grid_best": med["fix"] / med["grid_best"], "fix_time_vs_grid": fix_s / grid_s,
        "fix_vs_user": med["fix"] / med["user"], "fix_runs": _fix_runs(fix), "grid_points": len(grid),
        "online": online, "online_s": online_s, "online_epochs": online.get("epochs"),
        "online_vs_grid_best": med["online"] / med["grid_best"], "online_time_vs_grid": online_s / grid_s,
        "online_vs_user": med["online"] / med["user"],
        "tune_from_epoch2_vs_grid_best": med["tune_from_epoch2"] / med["grid_best"],
        "tune_last_vs_grid_best": med["tune_last"] / med["grid_best"],
        "tune_vs_user": med["tune_from_epoch2"] / med["user"],
    }  # fmt: skip


def _fix(kind: str, script: Path, root: str, options: list[str]) -> tuple[dict[str, Any], float]:
    """``dsanalyzer fix`` with ``options`` on the job: what fix.json holds, and the wall time it took."""
    with tempfile.TemporaryDirectory(prefix=f"bench-fix-{kind}-") as out:
        t = time.perf_counter()
        proc = subprocess.run(
            [DSANALYZER, "fix", "--quiet", *options, "--out", out, "--", PY, str(script), kind, root],
            capture_output=True, text=True, timeout=3600, env={**os.environ, "BENCH_EPOCHS": "1000"},
        )  # fmt: skip
        took = time.perf_counter() - t
        try:
            return json.loads((Path(out) / "fix.json").read_text()), took
        except FileNotFoundError:
            return {"error": (proc.stdout + proc.stderr)[-2000:]}, took


def _fix_runs(fix: dict[str, Any]) -> int:
    """The runs of the job ``dsanalyzer fix`` made: the profile's four, then each round's pairs."""
    rounds = fix.get("rounds") or []
    return 4 + sum(len(r.get("before_runs") or []) + len(r.get("after_runs") or []) for r in rounds)


def _knobs(kind: str, env: dict[str, str]) -> tuple:
    """A configuration's knobs as the job reads them (unset: the user's own, ``USER`` in ``JOB``)."""
    workers, prefetch = USER[kind]
    return (
        int(env.get("BENCH_WORKERS", workers)), int(env.get("BENCH_PREFETCH", prefetch)),
        int(env.get("BENCH_THREADS", "0")), env.get("BENCH_LOADER", ""), env.get("BENCH_LOADER_ARGS", "{}"),
    )  # fmt: skip


def table(results: dict[str, dict[str, Any]]) -> str:
    rows = [
        "| job | user | grid best (w, p, threads) | fix kept | fix / best | fix time / grid (runs / points) "
        "| fix / user | online kept | online / best | online time / grid (epochs) | online / user "
        "| tune ep.2+ / best | tune last / best | tune / user |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, r in results.items():
        b, m = r["grid_best"], r["median"]
        kept = r["fix"].get("kept") or {}
        rows.append(
            f"| {kind} | {m['user']:.0f} | {m['grid_best']:.0f} ({b['workers']}, {b['prefetch']}, {b['threads'] or 'default'}) "
            f"| {json.dumps(kept)} | {r['fix_vs_grid_best']:.2f} | {r['fix_time_vs_grid']:.2f} "
            f"({r.get('fix_runs', '?')} / {r.get('grid_points', '?')}) | {r['fix_vs_user']:.2f} "
            f"| {json.dumps(r['online'].get('kept') or {})} | {r['online_vs_grid_best']:.2f} "
            f"| {r['online_time_vs_grid']:.2f} ({r.get('online_epochs', '?')}) | {r['online_vs_user']:.2f} "
            f"| {r['tune_from_epoch2_vs_grid_best']:.2f} | {r['tune_last_vs_grid_best']:.2f} | {r['tune_vs_user']:.2f} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", nargs="+", default=list(JOBS), choices=JOBS)
    ap.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "coordl-bench-fix-synth"))
    ap.add_argument("--images", type=int, default=640)
    ap.add_argument(
        "--epochs", type=int, default=3, help="epochs per grid or final run (the first is dropped)"
    )
    ap.add_argument("--tune-epochs", type=int, default=6)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 3, 4], help="the grid's num_workers")
    ap.add_argument("--runs", type=int, default=3, help="alternated runs of the final comparison")
    ap.add_argument("--profile-iters", type=int, default=40)
    ap.add_argument("--fix-iters", type=int, default=40)
    ap.add_argument("--out", default=str(REPO / "reports" / "runs" / "bench_fix.json"))
    args = ap.parse_args(argv)
    if not os.path.isdir(args.data):
        subprocess.run(
            [str(Path(PY).with_name("coordl")), "synth", args.data, "--n", str(args.images)], check=True
        )
    with tempfile.TemporaryDirectory(prefix="bench-fix-") as tmp:
        script = Path(tmp) / "job.py"
        script.write_text(JOB)
        results = {}
        for kind in args.jobs:
            print(f"[{kind}]", flush=True)
            results[kind] = bench_job(kind, script, args.data, args)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(results, indent=1, default=str))
    print(table(results))
    for kind, r in results.items():  # the spread behind each median
        print(f"{kind} runs: " + "; ".join(f"{k} {[round(x) for x in v]}" for k, v in r["final"].items()))


if __name__ == "__main__":
    main()

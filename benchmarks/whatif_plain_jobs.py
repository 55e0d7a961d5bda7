"""The plain-torch family of ``bench_whatif_accuracy.py --family plain``: the cores axis on real jobs.

Each case is an unmodified training script over a plain ``torch.utils.data.DataLoader`` (the
README's example over ``coordl.ImageFolder``; a torch ``Dataset`` decoding JPEGs with Pillow), at a
worker count and batch size. For each case:

1. ``dsanalyzer profile`` runs the script restricted to one CPU (as ``taskset -c 0`` would);
2. the what-if predicts the job on two CPUs (``Model.predict(cpus=2, workers=w)``, what
   ``dsanalyzer whatif --cpus 2`` computes for the job's worker count);
3. the same script runs on two CPUs (``taskset -c 0,1``) in its measuring mode: samples/s from
   batch ``--skip`` on over ``--measure`` batches (epochs restart; the files are in the page cache, as
   the what-if's steady state has them), and the share of the two cores the job's processes got;
   then once more with ``torch.set_num_threads(1)`` in the script (the verdict's alternative: on 2
   cores torch's default of 2 intra-op threads in the main process spin beside the workers).

The machine's other load moves every wall-clock number here: each row also gives the job's CPU
share in the profile and in the measured run (``a``). The run as written is the target (torch's
default intra-op threads, which the what-if charges: dsanalyzer/model/cores.py); the run with one
thread is compared with the what-if for one thread.

Past 2 cores (``--cpus 2 4 8 16``: profile on the first 2 cores, predict and run on the first 4, 8,
16; ``--spare-cores 1``: each job with one worker per core but one; ``--runs 3``: the median of three
runs at each count; ``--measure-per-core``: longer runs where there are more cores;
``--as-written-only``: no one-thread runs) the same script, profile and prediction check the cores
axis where users run (``scripts/gpu/cores.py`` on the 16-core GPU host). rows.json is rewritten
after every count measured.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable

# One script for every case: the dataset kind, workers and batch size come from the command line.
SCRIPT = r'''
import json, os, resource, sys, time
import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

kind, root, workers, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
measure = int(sys.argv[5]) if len(sys.argv) > 5 else 0
skip = 10


class PillowFolder(Dataset):
    """A torch Dataset as users write it: list the JPEGs, decode with Pillow, resize, to a tensor."""

    def __init__(self, root):
        self.classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        self.files = [(os.path.join(root, c, f), i) for i, c in enumerate(self.classes)
                      for f in sorted(os.listdir(os.path.join(root, c)))]

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        path, label = self.files[i]
        with Image.open(path) as im:
            im = im.convert("RGB").resize((64, 64), Image.BILINEAR)
        x = torch.from_numpy(np.asarray(im, dtype=np.uint8).copy()).permute(2, 0, 1).float().div_(255)
        return x, label


def job_cpu():
    """(main process CPU, its workers' CPU): reaped workers through RUSAGE_CHILDREN (torch joins an
    epoch's workers), live ones read once here, so the timed loop itself reads no /proc files."""
    import psutil
    live = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
            live += t.user + t.system
        except psutil.Error:
            pass
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time(), live + reaped.ru_utime + reaped.ru_stime


if os.environ.get("PLAIN_TORCH_THREADS"):  # the verdict's advice when workers share the cores: one intra-op thread
    torch.set_num_threads(int(os.environ["PLAIN_TORCH_THREADS"]))
if kind == "readme":
    import coordl
    data = coordl.ImageFolder(root, transform=coordl.transforms.train_transform(64))
else:
    data = PillowFolder(root)
loader = DataLoader(data, batch_size=batch, shuffle=True, num_workers=workers)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                            torch.nn.Flatten(), torch.nn.Linear(16, len(data.classes)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
n, t0, samples = 0, None, 0
for epoch in range(1000 if measure else 3):
    for images, labels in loader:
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        opt.zero_grad(); loss.backward(); opt.step()
        n += 1
        if n == skip:
            t0, cpu0, samples = time.perf_counter(), job_cpu(), 0
        elif n > skip:
            samples += len(labels)
        if measure and n >= skip + measure:
            break
    if measure and n >= skip + measure:
        break
if measure:
    wall = time.perf_counter() - t0
    main1, workers1 = job_cpu()
    main_used, workers_used = main1 - cpu0[0], workers1 - cpu0[1]
    used, cores = main_used + workers_used, len(os.sched_getaffinity(0))
    batches = max(1, n - skip)
    print(json.dumps({"samples_per_s": samples / wall, "wall_s": wall, "job_cpu_s": used, "cores": cores,
                      "main_cpu_s_per_batch": main_used / batches, "workers_cpu_s_per_sample": workers_used / max(1, samples),
                      "torch_threads": torch.get_num_threads(),
                      "cpu_s_per_sample": used / max(1, samples),
                      "cpu_share": used / (wall * cores), "load1": os.getloadavg()[0]}))
'''

CASES = (  # (name, dataset kind, workers, batch)
    ("readme w2 b32", "readme", 2, 32),
    ("readme w1 b32", "readme", 1, 32),
    ("pillow w2 b16", "pillow", 2, 16),
    ("pillow w1 b64", "pillow", 1, 64),
)


PHOTOS = " photos"  # --photos: the case's job on the photographic dataset (coordl synth --photos)


def first_cores(n: int) -> set[int]:
    """The first ``n`` cores this process may run on (a cpuset such as ``taskset -c 0-(n-1)`` gives)."""
    mine = sorted(os.sched_getaffinity(0))
    if n > len(mine):
        raise ValueError(f"--cpus {n}: this process may run on {len(mine)} cores only")
    return set(mine[:n])


def _pinned(cores: set[int]):
    """A ``preexec_fn`` confining the child (and what it starts) to ``cores``: taskset without taskset."""
    return lambda: os.sched_setaffinity(0, cores)


def profile(script: Path, root: str, case: tuple, out: Path, iters: int, cpus: int = 1) -> dict:
    """``dsanalyzer profile`` of the case on the first ``cpus`` cores (CPU 0 alone by default); the report."""
    _, kind, workers, batch = case
    cmd = [
        PY, "-m", "dsanalyzer.cli", "profile", "--quiet", "--iters", str(iters), "--out", str(out), "--",
        PY, str(script), kind, root, str(workers), str(batch),
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, cwd=ROOT, timeout=900, preexec_fn=_pinned(first_cores(cpus))
    )
    if proc.returncode != 0:
        raise RuntimeError(f"profile of {case[0]} failed: {proc.stderr[-2000:]}")
    return json.loads((out / "report.json").read_text())


def measure(
    script: Path, root: str, case: tuple, batches: int, cpus: int = 2, threads: int | None = None
) -> dict:
    """The case run for real on the first ``cpus`` cores: steady samples/s, and the machine's load while it ran.

    ``threads``: the script calls ``torch.set_num_threads(threads)`` first (what the verdict advises
    when the main process's intra-op threads would share the cores with the workers)."""
    import psutil

    _, kind, workers, batch = case
    psutil.cpu_percent(interval=None)
    busy0 = psutil.cpu_times()
    cmd = [PY, str(script), kind, root, str(workers), str(batch), str(batches)]
    env = dict(os.environ, **({"PLAIN_TORCH_THREADS": str(threads)} if threads else {}))
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
        env=env,
        preexec_fn=_pinned(first_cores(cpus)),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"run of {case[0]} failed: {proc.stderr[-2000:]}")
    busy1 = psutil.cpu_times()
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    idle = (busy1.idle - busy0.idle) + (getattr(busy1, "iowait", 0) - getattr(busy0, "iowait", 0))
    total = sum(busy1) - sum(busy0)
    got["machine_busy_fraction"] = 1 - idle / total if total > 0 else None
    return got


def predict(report: dict, workers: int, cpus: int = 2) -> dict:
    """The what-if at ``cpus`` cores with the case's worker count, as written (torch's default intra-op
    threads) and with ``torch.set_num_threads(1)``; the bound; what the model charges per sample."""
    from dataclasses import replace

    from dsanalyzer.model.whatif import Model

    model = Model.from_report(report)
    kw = {"policy": model.cache_policy, "workers": workers}
    p = model.predict(model.cache_bytes, cpus, model.storage_bytes_per_s, **kw)
    one = replace(model, torch_threads=1, threads_follow_cores=False)
    p1 = one.predict(model.cache_bytes, cpus, model.storage_bytes_per_s, **kw)
    return {"samples_per_s": p.samples_per_s, "bound": p.bound, "cpu_share": model.cpu_share,
            "samples_per_s_1thread": p1.samples_per_s, "spin_cores": model.spin_cores(cpus, workers),
            "cpu_s_per_sample": model.cpu_per_sample() or 0.0}  # fmt: skip


def _spin_ms(report: dict) -> str:
    spin = (report.get("machine") or {}).get("omp_spin_s")
    return "?" if spin is None else f"{spin * 1e3:.2f} ms"


def _round(case: tuple, rnd: int, report: dict, pred: dict, got: dict, one: dict | None, cpus: int) -> None:
    v = report.get("verdict") or {}
    profiled = (report.get("machine") or {}).get("cpus")
    line = (
        f"{case[0]} ({case[2]} workers) round {rnd + 1}: {profiled}-CPU observed {report['rates_per_s']['observed']:.0f}/s, "
        f"bound {report['bound']}, verdict {v.get('bound')}, profile share {pred['cpu_share']:.2f}, CPU per sample "
        f"{pred['cpu_s_per_sample'] * 1e3:.2f} ms; {cpus} CPUs as written: predicted {pred['samples_per_s']:.0f}/s "
        f"(spin {pred['spin_cores']:.2f} cores: the host spins {_spin_ms(report)} after a region), measured {got['samples_per_s']:.0f}/s (share {got['cpu_share']:.2f}, "
        f"{got['cpu_s_per_sample'] * 1e3:.2f} ms per sample, main process {got['main_cpu_s_per_batch'] * 1e3:.1f} ms "
        f"per batch)"
    )
    if one is not None:
        line += (
            f"; torch.set_num_threads(1): predicted {pred['samples_per_s_1thread']:.0f}/s, measured "
            f"{one['samples_per_s']:.0f}/s (share {one['cpu_share']:.2f}, {one['cpu_s_per_sample'] * 1e3:.2f} ms, main "
            f"{one['main_cpu_s_per_batch'] * 1e3:.1f} ms)"
        )
    print(f"{line}; machine busy {got['machine_busy_fraction']:.0%}, load1 {got['load1']:.1f}", flush=True)


def at_cores(case: tuple, cpus: int, spare: int | None) -> tuple:
    """The case at ``cpus`` cores: its own worker count, or with ``spare`` one per core less ``spare`` (>= 1)."""
    return case if spare is None else (case[0], case[1], max(1, cpus - spare), case[3])


def _summary(name: str, cpus: int, workers: int, r: dict) -> dict:
    """One row of the table: a case at a core count, its rounds (and runs) folded into medians."""
    m, p, p1 = (statistics.median(r[k]) for k in ("meas", "preds", "preds1"))
    m1 = statistics.median(r["meas1"]) if r["meas1"] else None
    return {"case": name, "cpus": cpus, "workers": workers, "measured": m, "predicted": p, "error": (p - m) / m,
            "measured_1thread": m1, "predicted_1thread": p1, "error_1thread": (p1 - m1) / m1 if m1 else None,
            "bounds": r["bounds"], "verdicts": r["verdicts"], "shares": r["shares"], "measured_1thread_all": r["meas1"],
            "measured_all": r["meas"], "predicted_all": r["preds"], "predicted_1thread_all": r["preds1"],
            "stated_spread": r["stated"], "predicted_bounds": r["predicted_bounds"]}  # fmt: skip


def run_family(args, work: Path) -> list[dict]:
    """Every case: profile on the first ``args.cpus[0]`` cores, predict each later count, measure it there
    (``args.runs`` runs, ``args.rounds`` times); the rows, one per case and core count.

    rows.json is rewritten after every measured count, so a run stopped early keeps what it measured."""
    script = work / "plain_job.py"
    script.write_text(SCRIPT)
    cases = [c for c in CASES if not args.cases or c[0] in args.cases]
    if getattr(args, "photos", False):  # each case, then the same job on the photographs
        cases = [c for case in cases for c in (case, (f"{case[0]}{PHOTOS}", *case[1:]))]
    profiled, counts = args.cpus[0], args.cpus[1:]
    rows: list[dict] = []
    for case in cases:
        acc = {n: {k: [] for k in ("preds", "meas", "bounds", "verdicts", "shares", "stated", "meas1", "preds1", "predicted_bounds")}
               for n in counts}  # fmt: skip
        root = args.data
        if case[0].endswith(PHOTOS):
            import datakind

            root = str(datakind.photos_root(2000))  # as many files as the synthetic folder main_plain makes
        for rnd in range(args.rounds):
            here = at_cores(case, profiled, args.spare_cores)
            out = work / f"{case[0].replace(' ', '_')}-{rnd}"
            report = profile(script, root, here, out, args.iters, cpus=profiled)
            for n in counts:
                there, r = at_cores(case, n, args.spare_cores), acc[n]
                pred = predict(report, there[2], cpus=n)
                batches = args.measure_per_core * n if args.measure_per_core else args.measure
                runs = [measure(script, root, there, batches, cpus=n) for _ in range(args.runs)]
                one = (
                    None if args.as_written_only else measure(script, root, there, batches, cpus=n, threads=1)
                )
                got = sorted(runs, key=lambda g: g["samples_per_s"])[len(runs) // 2]
                r["preds"].append(pred["samples_per_s"])
                r["preds1"].append(pred["samples_per_s_1thread"])
                r["meas"] += [g["samples_per_s"] for g in runs]
                r["meas1"] += [one["samples_per_s"]] if one else []
                r["bounds"].append(report["bound"])
                r["predicted_bounds"].append(pred["bound"])
                r["verdicts"].append((report.get("verdict") or {}).get("bound"))
                r["stated"].append((report.get("verdict") or {}).get("spread"))
                r["shares"].append((pred["cpu_share"], got["cpu_share"]))
                _round(there, rnd, report, pred, got, one, n)
                done = [
                    _summary(case[0], k, at_cores(case, k, args.spare_cores)[2], acc[k])
                    for k in counts
                    if acc[k]["meas"]
                ]
                (work / "rows.json").write_text(json.dumps(rows + done, indent=1))
        rows += [_summary(case[0], n, at_cores(case, n, args.spare_cores)[2], acc[n]) for n in counts]
    return rows


def print_table(rows: list[dict], profiled: int = 1) -> bool:
    """The family's table; True when every case is within 10% and the median within 5%."""
    head = (
        f"{'case':<16} | {'CPUs':>4} | {'workers':>7} | {'measured':>9} | {'what-if':>8} | {'error':>7} | "
        f"{'a profile/run':>13} | {'1 thread':>8} | {'what-if':>7} | {'error':>7} | bound (measured / verdict)"
    )
    print(f"\nplain torch DataLoader jobs: profiled on {profiled} CPU(s) (the first cores), run on the first CPUs "
          "of each row as written")  # fmt: skip
    print(head + "\n" + "-" * len(head))
    for r in rows:
        one = (
            f"{r['measured_1thread']:>8.0f} | {r['predicted_1thread']:>7.0f} | {r['error_1thread']:>+7.1%}"
            if r["measured_1thread"]
            else f"{'-':>8} | {r['predicted_1thread']:>7.0f} | {'-':>7}"
        )
        print(
            f"{r['case']:<16} | {r['cpus']:>4} | {r['workers']:>7} | {r['measured']:>9.0f} | {r['predicted']:>8.0f} | "
            f"{r['error']:>+7.1%} | {statistics.median(a for a, _ in r['shares']):>6.2f}/"
            f"{statistics.median(b for _, b in r['shares']):<6.2f} | {one} | "
            f"{'/'.join(sorted(set(r['bounds'])))} / {'/'.join(sorted(set(map(str, r['verdicts']))))}"
        )
    for r in rows:
        if len(r["predicted_all"]) > 1:
            p, m = r["predicted_all"], r["measured_all"]
            half = (max(p) - min(p)) / 2 / statistics.median(p)
            spreads = [x for x in r["stated_spread"] if x is not None]
            print(
                f"{r['case']} at {r['cpus']} CPUs: {len(p)} profiles name {sorted(set(r['bounds']))} (verdict "
                f"{sorted(set(map(str, r['verdicts'])))}); predictions {min(p):.0f}-{max(p):.0f}/s (±{half:.1%}), runs "
                f"{min(m):.0f}-{max(m):.0f}/s; the reports state ±"
                + (f"{statistics.median(spreads):.1%} (median)" if spreads else "-")
            )
    errs = [abs(r["error"]) for r in rows]
    ok = bool(errs) and max(errs) <= 0.10 and statistics.median(errs) <= 0.05
    print(
        f"what-if, as written: median |error| {statistics.median(errs):.1%}, max {max(errs):.1%}: "
        f"target (median <= 5%, max <= 10%) {'met' if ok else 'NOT met'}"
    )
    one = [abs(r["error_1thread"]) for r in rows if r["error_1thread"] is not None]
    if one:
        print(
            f"with torch.set_num_threads(1): median |error| {statistics.median(one):.1%}, max {max(one):.1%}"
        )
    return ok


def main_plain(args) -> int:
    import tempfile

    work = Path(args.work or tempfile.mkdtemp(prefix="whatif-plain-"))
    work.mkdir(parents=True, exist_ok=True)
    if not os.path.isdir(args.data):
        subprocess.run(
            [PY, "-m", "coordl.cli", "synth", args.data, "--n", "2000", "--classes", "10"], check=True
        )
    rows = run_family(args, work)
    (work / "rows.json").write_text(json.dumps(rows, indent=1))
    return 0 if print_table(rows, args.cpus[0]) else 1

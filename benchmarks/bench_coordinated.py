"""Coordinated prep vs K independent loaders: K hyper-parameter-search jobs on one server.

Method: a synthetic ImageFolder (500x375 JPEGs) is made once and read into the page cache, so the jobs
are prep-bound (decode + random-resized-crop + flip + normalize), which is where coordination pays.
For K = 2, 3, 4, K job processes start together; each trains a small CNN (one SGD step per batch)
for ``--epochs`` epochs with ``coordl.DataLoader(num_workers=1)``, either independently or with
``coordinate=<group>``. Reported per configuration (median of ``--repeats`` runs):

* aggregate samples/s: samples consumed by all jobs / wall time until the last job finished;
* CPU-seconds per epoch: user+system time of the jobs' training loops and all their workers and
  producers (``RUSAGE_SELF`` + ``RUSAGE_CHILDREN`` inside each job, start-up imports excluded),
  summed over jobs and divided by the epochs each job ran.

Run: ``.venv/bin/python benchmarks/bench_coordinated.py`` (about 5 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = r"""
import resource, sys, time, torch
import coordl
from coordl.coordinated.job import Group
root, group, epochs, bs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(1)
torch.manual_seed(0)
ds = coordl.ImageFolder(root, transform=coordl.transforms.train_transform(112, resize=128))
kw = {"coordinate": Group(group, timeout_s=120)} if group != "-" else {}
loader = coordl.DataLoader(ds, batch_size=bs, shuffle=True, num_workers=1, **kw)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 5, stride=4), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                            torch.nn.Flatten(), torch.nn.Linear(8, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
def cpu():
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
n, cpu0, t0 = 0, cpu(), time.time()
for _ in range(epochs):
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y % 10).backward()
        opt.step()
        n += len(y)
t1 = time.time()
loader.close()  # reaps workers and producers, so their CPU time is counted
print(n, t0, t1, cpu() - cpu0)
"""


def run_config(root: str, k: int, coordinated: bool, epochs: int, batch_size: int) -> tuple[float, float]:
    group = f"bench-{os.getpid()}-{time.monotonic_ns()}" if coordinated else "-"
    procs = [
        subprocess.Popen([sys.executable, "-c", JOB, root, group, str(epochs), str(batch_size)],
                         stdout=subprocess.PIPE, text=True)
        for _ in range(k)
    ]  # fmt: skip
    samples, starts, ends, cpu = 0, [], [], 0.0
    for p in procs:
        out, _ = p.communicate(timeout=900)
        if p.returncode != 0:
            raise SystemExit(f"a job failed with exit code {p.returncode}")
        n, t0, t1, c = out.strip().splitlines()[-1].split()
        samples, cpu = samples + int(n), cpu + float(c)
        starts.append(float(t0))
        ends.append(float(t1))
    # Training-loop time only: from the first job's first batch request to the last job's end.
    return samples / (max(ends) - min(starts)), cpu / epochs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--jobs", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--root", default=None, help="dataset directory (default: under the temp dir)")
    args = ap.parse_args()
    args.root = args.root or os.path.join(tempfile.gettempdir(), f"coordl-bench-coord-{args.images}")

    from coordl.datasets.synth import make_dataset

    root = str(make_dataset(args.root, n=args.images, classes=10, seed=0))
    for path in Path(root).rglob("*.jpg"):  # warm the page cache: this benchmark is about prep
        path.read_bytes()
    print(f"dataset: {args.images} JPEGs 500x375 in {root}; {os.cpu_count()} cores; "
          f"{args.epochs} epochs per job; median of {args.repeats}", flush=True)  # fmt: skip
    rows = []
    for k in args.jobs:
        res = {}
        for coordinated in (False, True):
            runs = [
                run_config(root, k, coordinated, args.epochs, args.batch_size) for _ in range(args.repeats)
            ]
            res[coordinated] = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
            print(f"  K={k} {'coordinated' if coordinated else 'independent'}: "
                  f"{res[coordinated][0]:.0f} samples/s, {res[coordinated][1]:.1f} CPU-s/epoch", flush=True)  # fmt: skip
        rows.append((k, res[False], res[True]))
    print()
    print(
        "| K jobs | independent samples/s | coordinated samples/s | speed-up | independent CPU-s/epoch "
        "| coordinated CPU-s/epoch | CPU ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    for k, ind, coo in rows:
        print(f"| {k} | {ind[0]:.0f} | {coo[0]:.0f} | {coo[0] / ind[0]:.2f}x | {ind[1]:.1f} | {coo[1]:.1f} "
              f"| {ind[1] / coo[1]:.2f}x less |")  # fmt: skip


if __name__ == "__main__":
    main()

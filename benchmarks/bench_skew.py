"""What skewed per-sample prep costs: photographs of ImageNet's spread of sizes against synthetic images of one size.

    .venv/bin/python benchmarks/bench_skew.py                # ~10 min on the 2-core VM
    .venv/bin/python benchmarks/bench_skew.py --rounds 5 --n 4000 --data-dir /tmp/skew-data

Two datasets of ``--n`` files: ``coordl synth --photos`` (crops of real photographs with ImageNet's
widths, heights, qualities, chroma layouts and odd files: ``docs/datasets.md``) and ``coordl synth``
(500x375, quality 90, 4:2:0: every file alike). Both go through the standard ImageNet training prep,
``coordl.transforms.train_transform(224)`` (decode, of the crop's box only where the crop decoder applies,
RandomResizedCrop 224, flip, to tensor, normalize).

**Per-sample prep time**: one process, one thread, every file's bytes in memory, each sample prepped once
(torch seeded); CPU time per call (``time.thread_time``): p50, p90, p99, max, mean. The
**work-conserving bound** is ``cores / mean``: every core prepping all the time, nothing else, no sample
ever waited for. A loader can only fall short of it.

**Loaders** (batch ``--batch``, ``--workers`` workers, shuffled, persistent workers, a consumer that does
nothing with the batch): torch ``DataLoader`` with ``in_order=True`` (the default: batch k is handed out
only after batch k-1, so one slow batch holds up the ready ones behind it), torch with ``in_order=False``
(batches handed out as they are made), ``coordl.DataLoader`` as it is today (defaults, no cache: the
files sit in the page cache), and coordl with ``in_order=False``. Samples/s are of epochs 2 onwards
(epoch 1 starts the workers); the **batch wait** is the time the consumer spends in ``next()`` per batch
(p50, p99, pooled over the rounds). Each configuration runs in a fresh process; rounds alternate the
configurations (each round starts one further along); the table shows medians and the min-max over
rounds.

**The shared host.** Other work on the cores slows every configuration by a different amount. Each worker's
main thread's ``/proc/PID/task/PID/schedstat`` splits its wall time into running, **waiting for a CPU**
(runnable while other processes held the cores) and **blocked** (nothing to do: the loader's own idle
time, e.g. a worker whose prefetch slots are full behind a batch not yet taken). ``samples/s, CPU waits
out`` divides the rate by the share not spent waiting for a CPU: a first-order estimate of the rate on
idle cores, checked by the measured executor (``--workers`` processes, each taking the next sample from a
shared counter), which it puts at 90-100% of the bound. **Skew alone** (``skew_sim.py``) replays torch's
dispatch on the measured sample times with no loader cost and no other work, at 2, 8 and 16 workers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from skew_tables import LOADERS, table

SEED = 0
STEADY_SKIP = 2  # batches left out at each end of an epoch for the steady-state rate


def _files(root: str) -> list[tuple[str, int]]:
    import coordl

    return list(coordl.ImageFolder(root).samples)


def _rare(raw: bytes) -> bool:
    """A PNG named .JPEG or a CMYK JPEG: ImageNet has 23 in 1.28M files, the photographs here one of each."""
    import simplejpeg

    if not simplejpeg.is_jpeg(raw):
        return True
    return simplejpeg.decode_jpeg_header(raw)[2] in ("CMYK", "YCCK")


def child_prep(root: str) -> dict:
    """Each file prepped twice in this process, the second pass timed: per-sample CPU s, in ImageFolder order.

    The first pass pays what a process pays once (a Pillow plugin's import, torch's first warning: 75 ms at
    the first PNG here), which a loader's worker also pays once, not per sample."""
    import torch

    import coordl

    torch.set_num_threads(1)
    tf = coordl.transforms.train_transform(224)
    raws = [Path(p).read_bytes() for p, _ in _files(root)]
    torch.manual_seed(SEED + 1)
    for raw in raws:
        tf(raw)
    torch.manual_seed(SEED)
    cpu_s = []
    for raw in raws:
        t0 = time.thread_time()
        tf(raw)
        cpu_s.append(time.thread_time() - t0)
    return {"cpu_s": cpu_s, "bytes": [len(r) for r in raws], "rare": [_rare(r) for r in raws]}


def _pool_worker(
    raws: list[bytes], order: list[int], counter: Any, start: Any, done: Any, epochs: int, k: int
) -> None:
    import torch

    import coordl

    torch.set_num_threads(1)
    torch.manual_seed(SEED + k)
    tf = coordl.transforms.train_transform(224)
    for _ in range(epochs):
        start.wait()
        while True:
            with counter.get_lock():
                i = counter.value
                counter.value += 1
            if i >= len(order):
                break
            tf(raws[order[i]])
        done.wait()


def child_pool(root: str, epochs: int, workers: int) -> dict:
    """The work-conserving executor, measured: ``workers`` processes each taking the next sample as soon as it
    is free (a shared counter), the bytes in memory, no batches, no hand-off. Samples/s per epoch, epochs 2 on."""
    import multiprocessing as mp
    import random

    ctx = mp.get_context("fork")
    raws = [Path(p).read_bytes() for p, _ in _files(root)]
    order = list(range(len(raws)))
    random.Random(SEED).shuffle(order)
    counter = ctx.Value("q", 0)
    start, done = ctx.Barrier(workers + 1), ctx.Barrier(workers + 1)
    procs = [
        ctx.Process(target=_pool_worker, args=(raws, order, counter, start, done, epochs, k))
        for k in range(workers)
    ]
    for proc in procs:
        proc.start()
    rates, waiting, blocked = [], [], []
    pids = [proc.pid for proc in procs if proc.pid is not None]
    for epoch in range(epochs):
        counter.value = 0
        sched0 = _sched_ns(pids)
        start.wait()
        t0 = time.perf_counter()
        done.wait()
        wall_s = time.perf_counter() - t0
        if epoch:
            rates.append(len(order) / wall_s)
            w, b = _shares(sched0, _sched_ns(pids), wall_s, workers)
            waiting.append(w)
            blocked.append(b)
    for proc in procs:
        proc.join()
    return {"rates": rates, "waiting": waiting, "blocked": blocked}


def _sched_ns(pids: list[int]) -> dict[int, tuple[int, int]]:
    """Per process: ns its main thread ran and ns it was runnable but waited for a CPU (``schedstat``)."""
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
                ran, waited, _ = f.read().split()
        except (OSError, ValueError):
            continue
        out[pid] = (int(ran), int(waited))
    return out


def _shares(before: dict, after: dict, wall_s: float, k: int) -> tuple[float, float]:
    """Of the ``k`` busiest processes' time: (share waiting for a CPU, share blocked: neither running nor waiting).

    Waiting for a CPU is the shared host's doing (other work on the cores); blocked is the loader's: a
    worker with nothing to do, its prefetch slots full behind a batch the consumer has not taken yet."""
    deltas = sorted(
        ((a[0] - before[pid][0], a[1] - before[pid][1]) for pid, a in after.items() if pid in before),
        reverse=True,
    )[:k]
    ran = sum(d[0] for d in deltas) / 1e9 / (k * wall_s)
    waited = sum(d[1] for d in deltas) / 1e9 / (k * wall_s)
    return waited, max(0.0, 1.0 - ran - waited)


def _children_cpu_s() -> float:
    import psutil

    total = 0.0
    for kid in psutil.Process().children(recursive=True):
        try:
            t = kid.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def child_loader(cfg: str, root: str, epochs: int, workers: int, batch: int) -> dict:
    """``epochs`` epochs through one loader: samples/s and the consumer's wait per batch, epochs 2 on."""
    import torch

    import coordl

    torch.set_num_threads(1)
    ds = coordl.ImageFolder(root, transform=coordl.transforms.train_transform(224))
    common: dict[str, Any] = dict(
        batch_size=batch,
        shuffle=True,
        num_workers=workers,
        persistent_workers=True,
        generator=torch.Generator().manual_seed(SEED),
        in_order=not cfg.endswith("_any"),
    )
    loader = (
        torch.utils.data.DataLoader(ds, **common)
        if cfg.startswith("torch")
        else coordl.DataLoader(ds, **common)
    )
    import psutil

    rates, steady, waits, cpu, waiting, blocked = [], [], [], [], [], []
    for epoch in range(epochs):
        cpu0 = _children_cpu_s()
        pids = [kid.pid for kid in psutil.Process().children(recursive=True)]
        sched0 = _sched_ns(pids)
        t_start = last = time.perf_counter()
        arrivals, sizes = [], []
        for _images, labels in loader:
            now = time.perf_counter()
            arrivals.append(now)
            sizes.append(len(labels))
            if epoch:
                waits.append(now - last)
            last = time.perf_counter()
        if epoch:
            wall_s = time.perf_counter() - t_start
            rates.append(sum(sizes) / wall_s)
            w, b = _shares(sched0, _sched_ns(pids), wall_s, workers)
            waiting.append(w)
            blocked.append(b)
            cpu.append((_children_cpu_s() - cpu0) / sum(sizes))
            a, b = STEADY_SKIP, len(arrivals) - 1 - STEADY_SKIP  # leave out the epoch's fill and drain
            if b - a < 4:
                raise SystemExit(f"--n too small for a steady state: {len(arrivals)} batches an epoch")
            steady.append(sum(sizes[a + 1 : b + 1]) / (arrivals[b] - arrivals[a]))
    if hasattr(loader, "close"):
        loader.close()
    return {
        "rates": rates,
        "steady": steady,
        "waits": waits,
        "workers_cpu_s": cpu,
        "waiting": waiting,
        "blocked": blocked,
    }


def _child(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"bench_skew: child {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _build(data_dir: Path, n: int) -> dict[str, str]:
    from coordl.datasets import photos, synth

    return {
        "photos": str(photos.make_dataset(data_dir / f"photos-{n}", n=n, classes=10, seed=SEED)),
        "synthetic": str(synth.make_dataset(data_dir / f"synth-{n}", n=n, classes=10, seed=SEED)),
    }


def run(args: argparse.Namespace, data_dir: Path) -> dict:
    roots = _build(data_dir, args.n)
    configs = [c for c in args.loaders.split(",") if c]
    res: dict = {ds: {"prep": [], "pool": [], **{c: [] for c in configs}} for ds in roots}
    loader_args = [str(args.epochs), str(args.workers), str(args.batch)]
    for r in range(args.rounds):
        order = configs[r % len(configs) :] + configs[: r % len(configs)]
        for ds, root in roots.items():
            res[ds]["prep"].append(_child(["prep", root]))
            res[ds]["pool"].append(_child(["pool", root, str(args.epochs), str(args.workers)]))
            for cfg in order:
                res[ds][cfg].append(_child(["loader", cfg, root, *loader_args]))
        line = ", ".join(
            f"{ds} {c} {statistics.median(v[c][-1]['rates']):.0f}/s" for ds, v in res.items() for c in configs
        )
        print(f"round {r}: {line}", flush=True)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, default=2000, help="files per dataset (default 2000)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3, help="per loader run; epoch 1 is not counted (default 3)")
    p.add_argument("--workers", type=int, default=2, help="loader workers, and the cores of the bound")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--loaders", default=",".join(LOADERS), help=f"any of {','.join(LOADERS)}")
    p.add_argument("--data-dir", default="", help="keep the datasets here (default: a temporary directory)")
    p.add_argument("--json", default="", help="also write the raw results here")
    p.add_argument(
        "--from-json", default="", help="print the tables of results written by --json, run nothing"
    )
    p.add_argument("--replay-workers", default="2,8,16", help="worker counts of the replayed dispatch")
    p.add_argument("--replay-batch", type=int, default=0, help="batch size of the replay (default: --batch)")
    args = p.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "prep":
            result = child_prep(rest[0])
        elif kind == "pool":
            result = child_pool(rest[0], int(rest[1]), int(rest[2]))
        else:
            cfg, root, epochs, workers, batch = rest
            result = child_loader(cfg, root, int(epochs), int(workers), int(batch))
        print(json.dumps(result))
        return
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        if "results" in saved:
            replay = {k: v for k, v in vars(args).items() if k.startswith("replay_")}
            args = argparse.Namespace(**{**vars(args), **saved["args"], **replay})
            saved = saved["results"]
        print(table(args, saved))
        return
    print(f"host: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start", flush=True)
    if args.data_dir:
        res = run(args, Path(args.data_dir))
    else:
        with tempfile.TemporaryDirectory(prefix="bench-skew-", dir=os.environ.get("COORDL_BENCH_DIR")) as tmp:
            res = run(args, Path(tmp))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": res}))
    print()
    print(table(args, res))


if __name__ == "__main__":
    main()

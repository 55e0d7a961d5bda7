"""What-if accuracy: predict from one profile, then really run 3 cache sizes x 2 worker counts.

    .venv/bin/python benchmarks/bench_whatif_accuracy.py            # about 3 minutes on 2 cores
    .venv/bin/python benchmarks/bench_whatif_accuracy.py --family plain --rounds 1   # plain torch jobs,
                                                            # the cores axis: profile on 1 CPU, run on 2

The workload has known costs: items of ``--item-kb`` KB fetched from an emulated storage device
of ``--storage-mbps`` MB/s (one FIFO server shared by every worker process, like a disk or a throttled
link), a prep that burns ``--prep-ms`` of CPU time per item, and a training step of ``--step-ms`` per
batch that uses no CPU (a GPU). The loader is coordl.DataLoader, whose ``cache_bytes`` is the MinIO
cache the model's ``minio`` policy describes.

1. Profile (the differential runs, each the median of ``--repeats``): compute rate G from the step
   alone; prep rate P(k) from the loader with every item served from memory at k = 1..cores workers;
   run 2, the full job with every item from memory; storage bytes/s and items/s from timed reads;
   memory bandwidth. These fill a schema-1 report.
2. Predict with ``dsanalyzer.model.whatif.Model`` for each (cache, workers). Two baselines are predicted from
   the same measurements: ``min-only`` = min(G, P(w), F(h)), the stage model without the per-worker
   fetch-then-prep cycle; ``dsa-orig`` = the same with the original DS-Analyzer's 525 MB/s disk.
3. Run each configuration for real: one cold epoch fills the cache, then the steady-state rate is
   timed over the next epoch (first batches dropped), median of ``--repeats``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coordl.dataloader import DataLoader  # noqa: E402
from dsanalyzer.model.whatif import Model  # noqa: E402

_DS_ANALYZER_DISK_BYTES_PER_S = 525e6  # the constant the original what-if hard-codes (for the baseline only)


class EmulatedStorage:
    """A storage device of fixed bandwidth: one FIFO server whose clock all worker processes share."""

    def __init__(self, bytes_per_s: float) -> None:
        self.bytes_per_s = bytes_per_s
        # A raw shared double + its lock, inherited by forked workers (nothing pickled).
        self._busy_until = mp.get_context("fork").Value("d", 0.0)

    def read(self, nbytes: int) -> None:
        if self.bytes_per_s <= 0:  # "from memory": no device
            return
        with self._busy_until.get_lock():
            now = time.monotonic()
            done = max(now, self._busy_until.value) + nbytes / self.bytes_per_s
            self._busy_until.value = done
        time.sleep(max(0.0, done - time.monotonic()))


class SyntheticSource:
    """An item source with known costs: fetch through ``storage``, prep burning ``prep_s`` of CPU."""

    def __init__(self, items: int, item_bytes: int, prep_s: float, storage: EmulatedStorage) -> None:
        self.items, self.item_bytes, self.prep_s, self.storage = items, item_bytes, prep_s, storage
        self._payload = np.random.default_rng(0).integers(0, 255, item_bytes, dtype=np.uint8).tobytes()

    def __len__(self) -> int:
        return self.items

    def fetch(self, index: int) -> bytes:
        self.storage.read(self.item_bytes)
        return self._payload

    def prep(self, raw: bytes, index: int) -> torch.Tensor:
        end = time.thread_time() + self.prep_s  # CPU time, so contention stretches it as it would real prep
        while time.thread_time() < end:
            for _ in range(300):  # reading the CPU clock is a syscall: not on every iteration
                pass
        return torch.frombuffer(bytearray(raw[:64]), dtype=torch.uint8).float()


def _loader(src: SyntheticSource, args, workers: int, cache_bytes: int) -> DataLoader:
    return DataLoader(
        src, batch_size=args.batch, shuffle=True, num_workers=workers, cache_bytes=cache_bytes,
        persistent_workers=True, prefetch_factor=2, timeout=120,
    )  # fmt: skip


class Step:
    """The training step: ``step_s`` of GPU work (matrix products, synchronised) or, on CPU, a sleep.

    A sleep stands in for a GPU on a CPU-only machine: like a GPU step it leaves the cores to prep.
    """

    def __init__(self, step_s: float, device: str) -> None:
        self.step_s, self.device, self.reps = step_s, device, 0
        if device == "cuda" and step_s > 0:
            self.x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
            for _ in range(3):
                self.x @ self.x
            torch.cuda.synchronize()
            one = min(_timed(lambda: (self.x @ self.x, torch.cuda.synchronize())) for _ in range(20))
            self.reps = max(1, round(step_s / one))

    def __call__(self, batch: torch.Tensor | None = None) -> None:
        if self.step_s <= 0:
            return
        if self.device != "cuda":
            time.sleep(self.step_s)
            return
        if batch is not None:
            batch.to("cuda", non_blocking=True)
        for _ in range(self.reps):
            self.x @ self.x
        torch.cuda.synchronize()  # the iteration boundary: the step's work is done


def _steady_rate(
    loader: DataLoader, step: Step | None, skip_batches: int, receive_cpu: list | None = None
) -> float:
    """Samples/s over one epoch, from the arrival of batch ``skip_batches`` to the last one.

    ``receive_cpu`` gets the main thread's CPU seconds inside each ``__next__`` (what dsanalyzer's
    Timeline reads as the main process's own receive cost).
    """
    marks: list[tuple[float, int]] = []
    it = iter(loader)
    while True:
        cpu0 = time.thread_time()
        batch = next(it, None)
        if batch is None:
            break
        if receive_cpu is not None:
            receive_cpu.append(time.thread_time() - cpu0)
        marks.append((time.perf_counter(), len(batch)))
        if step is not None:
            step(batch)
    t0 = marks[skip_batches][0]
    samples = sum(n for _, n in marks[skip_batches + 1 :])
    return samples / (marks[-1][0] - t0)


def _memory_bandwidth() -> float:
    try:
        from dsanalyzer.measure.membw import measure_memory_bandwidth
    except ImportError:  # dsanalyzer's measurement module is optional here: same method inline
        src = np.ones(64 << 20, dtype=np.uint8)
        dst = np.zeros_like(src)
        np.copyto(dst, src)
        best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(5))
        return src.nbytes / best
    return measure_memory_bandwidth()


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def profile(args, step: Step) -> dict:
    """The differential measurements, as a schema-1 report (only the fields the model reads)."""
    item_bytes = args.item_kb * 1000
    batch = torch.zeros(args.batch, 64)
    step_times = [_timed(lambda: step(batch)) for _ in range(30)]
    compute = args.batch / statistics.median(step_times)
    ks = args.profile_workers or list(range(1, (os.cpu_count() or 1) + 1))
    prep_rates = []
    for k in ks:
        src = SyntheticSource(args.items, item_bytes, args.prep_ms / 1e3, EmulatedStorage(0))
        with _loader(src, args, k, 0) as loader:
            _steady_rate(loader, None, args.skip)  # warm the workers up
            prep_rates.append(
                statistics.median(_steady_rate(loader, None, args.skip) for _ in range(args.repeats))
            )
    # run 2 of the differential method: the full job (step included), every item from memory
    src = SyntheticSource(args.items, item_bytes, args.prep_ms / 1e3, EmulatedStorage(0))
    with _loader(src, args, ks[-1], 0) as loader:
        _steady_rate(loader, step, args.skip)
        receive: list[float] = []
        run2 = statistics.median(_steady_rate(loader, step, args.skip, receive) for _ in range(args.repeats))
    store = EmulatedStorage(args.storage_mbps * 1e6)
    n_reads = 60
    fetch_s = statistics.median(
        _timed(lambda: [store.read(item_bytes) for _ in range(n_reads)]) for _ in range(3)
    )
    return {
        "schema_version": 1,
        "machine": {"cpus": os.cpu_count(), "mem_bandwidth_bytes_per_s": _memory_bandwidth()},
        "dataset": {"items": args.items, "bytes": args.items * item_bytes, "avg_item_bytes": item_bytes},
        "batch_size": args.batch,
        "workers": ks[-1],
        "cache_bytes": 0,
        "cache_policy": "minio",
        "rates_per_s": {"compute": compute, "prep": prep_rates[-1], "fetch": n_reads / fetch_s},
        "prep_scaling": {"workers": ks, "samples_per_s": prep_rates},
        "fetch": {"bytes_per_s": n_reads * item_bytes / fetch_s, "items_per_s": n_reads / fetch_s},
        "runs": {"prep": {"samples_per_s": run2}},
        # the main thread's own CPU per batch receiving it (the step is a sleep or a GPU: no host CPU)
        "main_process": {"receive_cpu_s_per_batch": statistics.median(receive), "step_cpu_s_per_batch": 0.0},
    }


def real_rate(args, step: Step, workers: int, cache_bytes: int) -> float:
    src = SyntheticSource(
        args.items, args.item_kb * 1000, args.prep_ms / 1e3, EmulatedStorage(args.storage_mbps * 1e6)
    )
    with _loader(src, args, workers, cache_bytes) as loader:
        for _ in loader:  # cold epoch: fills the MinIO cache (not timed, no step)
            pass
        return _steady_rate(loader, step, args.skip)


def _baseline(model: Model, cache: float, workers: int, storage: float) -> float:
    """min(G, P(w), F(h)): the stage model without the per-worker fetch-then-prep cycle."""
    p = model.predict(cache, model.cpus, storage, policy="minio", workers=workers)
    return min(p.stage_rates["compute"], p.stage_rates["prep"], p.stage_rates["fetch"])


def _row(
    frac: float, w: int, measured: list[float], preds: list[tuple[float, float, float]], bound: str
) -> tuple:
    m = statistics.median(measured)
    cols = [statistics.median(p[i] for p in preds) for i in range(3)]
    errs = [(c - m) / m for c in cols]
    line = (
        f"{frac:>6.0%} {w:>7} | {m:>9.1f} {min(measured):>6.0f}-{max(measured):<6.0f}| "
        f"{cols[0]:>8.1f} {errs[0]:>+7.1%} {bound:>7} | {cols[1]:>8.1f} {errs[1]:>+7.1%} | {cols[2]:>8.1f} {errs[2]:>+7.1%}"
    )
    return line, errs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=480)
    ap.add_argument("--item-kb", type=int, default=32)
    ap.add_argument("--storage-mbps", type=float, default=8.0)
    ap.add_argument("--prep-ms", type=float, default=2.5)
    ap.add_argument("--step-ms", type=float, default=32.0)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--cache-fractions", type=float, nargs="+", default=[0.25, 0.6, 0.9])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts of the real runs")
    ap.add_argument("--profile-workers", type=int, nargs="+", help="k for P(k) (default: 1..cores)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where the step runs")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of (profile, then every real run)")
    ap.add_argument("--repeats", type=int, default=1, help="timed epochs per profile measurement")
    ap.add_argument("--skip", type=int, default=3, help="batches dropped at the start of a timed epoch")
    ap.add_argument("--family", choices=["synthetic", "plain"], default="synthetic",
                    help="synthetic: coordl.DataLoader with known costs (below); plain: plain torch DataLoader "
                    "jobs profiled on 1 CPU and run on 2 (benchmarks/whatif_plain_jobs.py)")  # fmt: skip
    ap.add_argument(
        "--data", default="/tmp/whatif-plain-synth", help="plain: the JPEG folder (made if missing)"
    )
    ap.add_argument("--work", help="plain: where the scripts and reports go (default: a temp dir)")
    ap.add_argument("--iters", type=int, default=40, help="plain: measured iterations per profile run")
    ap.add_argument("--measure", type=int, default=150, help="plain: batches timed in the 2-CPU run")
    ap.add_argument("--cases", nargs="+", help="plain: case names to run (default: all)")
    ap.add_argument("--cpus", type=int, nargs="+", default=[1, 2],
                    help="plain: profile on the first N cores (the first count), predict and run on the first "
                    "cores of each later count (default: 1 2)")  # fmt: skip
    ap.add_argument("--spare-cores", type=int, help="plain: run every case with cores - N workers (at least 1) "
                    "at each count, instead of its own worker count")  # fmt: skip
    ap.add_argument("--runs", type=int, default=1, help="plain: runs per count and round (their median)")
    ap.add_argument(
        "--measure-per-core", type=int, help="plain: batches timed per core of the run (for --measure)"
    )
    ap.add_argument("--as-written-only", action="store_true", help="plain: no torch.set_num_threads(1) runs")
    ap.add_argument("--photos", action="store_true",
                    help="plain: each case also on the photographic dataset of 2000 files (coordl synth --photos), "
                    "right after the synthetic one")  # fmt: skip
    args = ap.parse_args(argv)
    if args.family == "plain" and (len(args.cpus) < 2 or min(args.cpus) < 1):
        ap.error(f"--cpus needs a core count to profile on and at least one to run on, got {args.cpus}")
    if args.family == "plain":
        from whatif_plain_jobs import main_plain

        return main_plain(args)

    t_start = time.time()
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    step = Step(args.step_ms / 1e3, device)
    print(
        f"machine: {os.cpu_count()} cpus, step on {device}"
        + (f" ({step.reps} bf16 4096^3 matmuls)" if step.reps else "")
    )
    dataset_bytes = args.items * args.item_kb * 1000
    configs = [(f, w) for f in args.cache_fractions for w in args.workers]
    measured: dict = {c: [] for c in configs}
    predicted: dict = {c: [] for c in configs}
    bounds: dict = {}
    # Each round profiles, then runs every configuration: the machine is shared, and its load drifts
    # over minutes, so a prediction is compared with runs made right after its own profile.
    for rnd in range(args.rounds):
        report = profile(args, step)
        model = Model.from_report(report)
        r = report["rates_per_s"]
        print(
            f"round {rnd + 1} profile: G={r['compute']:.1f}/s  "
            f"P(k)={[round(x, 1) for x in report['prep_scaling']['samples_per_s']]}/s  "
            f"storage={report['fetch']['bytes_per_s'] / 1e6:.2f} MB/s ({report['fetch']['items_per_s']:.1f} items/s)  "
            f"membw={report['machine']['mem_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s  "
            f"usl sigma={model.prep.sigma:.3f}  run2={report['runs']['prep']['samples_per_s']:.1f}/s "
            f"(batch overhead {model.batch_overhead_s * 1e3:.2f} ms)",
            flush=True,
        )
        for frac, w in configs:
            cache = int(frac * dataset_bytes)
            pred = model.predict(cache, model.cpus, model.storage_bytes_per_s, policy="minio", workers=w)
            base = _baseline(model, cache, w, model.storage_bytes_per_s)
            orig = _baseline(model, cache, w, _DS_ANALYZER_DISK_BYTES_PER_S)
            predicted[(frac, w)].append((pred.samples_per_s, base, orig))
            bounds[(frac, w)] = pred.bound
            measured[(frac, w)].append(real_rate(args, step, w, cache))
    head = (
        f"{'cache':>6} {'workers':>7} | {'measured':>9} {'range':^13}| {'whatif':>8} {'err':>7} {'bound':>7} | "
        f"{'min-only':>8} {'err':>7} | {'dsa-orig':>8} {'err':>7}"
    )
    print("\nsamples/s, medians over rounds (range: min-max of the measured rounds)")
    print(head + "\n" + "-" * len(head))
    errors: list[list[float]] = [[], [], []]
    for c in configs:
        line, errs = _row(c[0], c[1], measured[c], predicted[c], bounds[c])
        print(line)
        for i, e in enumerate(errs):
            errors[i].append(abs(e))
    print("-" * len(head))
    for name, errs in zip(("whatif", "min-only", "dsa-orig"), errors, strict=True):
        print(f"{name:>8}: median |error| {statistics.median(errs):.1%}, max |error| {max(errs):.1%}")
    ok = statistics.median(errors[0]) <= 0.05 and max(errors[0]) <= 0.10
    print(
        f"target (median <= 5%, max <= 10%): {'met' if ok else 'NOT met'}; took {time.time() - t_start:.0f} s"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

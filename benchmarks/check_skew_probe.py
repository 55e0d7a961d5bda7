"""How close dsanalyzer's skew estimate from a profile's sample comes to the one from every item.

The profile times up to 256 items (``dsanalyzer.measure.prepspread``) and the verdict replays in-order
hand-out on batches drawn from those times (``dsanalyzer.model.skew.in_order_loss``). Here, on ``--n``
files of ``coordl synth --photos`` with ``coordl.transforms.train_transform(224)``: the probe at several
seeds (its spread, its wall time and the loss it gives at each batch x workers) against the reference,
every file timed (warm: a second pass) and replayed over an epoch of 200,000 samples by
``skew_sim.py`` (the benchmark's replay over a whole ImageNet-sized epoch, on the same dispatch model).

    .venv/bin/python benchmarks/check_skew_probe.py --n 1000 --seeds 6 [--measure 1x2]

Prints one table; timings are CPU time (thread_time), so a loaded host moves them little. ``--measure
BATCHxWORKERS`` also measures ``in_order=True`` against ``False`` on coordl's and torch's loaders (the
second epoch of each, alternated rounds) beside the gain the probe predicts; those are wall-clock rates,
which a loaded host moves.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from skew_sim import replay

from dsanalyzer.measure.prepspread import measure_prep_spread
from dsanalyzer.model.skew import in_order_loss

SHAPES = ((64, 2), (64, 16), (16, 16))


def _epoch_rate(ds: Any, kind: str, batch: int, workers: int, in_order: bool) -> float:
    """Samples/s of the second epoch (the first starts the workers) of a loader over ``ds``."""
    import torch

    import coordl

    cls = coordl.DataLoader if kind == "coordl" else torch.utils.data.DataLoader
    dl = cls(ds, batch_size=batch, num_workers=workers, in_order=in_order, persistent_workers=True)
    for _ in dl:
        pass
    t0, n = time.perf_counter(), 0
    for b in dl:
        n += len(b[0])
    return n / (time.perf_counter() - t0)


def measure_in_order(ds: Any, batch: int, workers: int, rounds: int) -> None:
    """The probe's predicted gain of in_order=False against both loaders measured, alternated rounds."""
    gain = in_order_loss(measure_prep_spread(len(ds), ds.prep, ds.fetch)["cpu_s"], batch, workers)["gain"]
    cfgs = [(k, o) for k in ("coordl", "torch") for o in (True, False)]
    res: dict = {c: [] for c in cfgs}
    for r in range(rounds):
        for c in cfgs[r % len(cfgs) :] + cfgs[: r % len(cfgs)]:
            res[c].append(_epoch_rate(ds, c[0], batch, workers, c[1]))
    print(f"\nbatch {batch}, {workers} workers: the probe predicts in_order=False {gain:+.1%}")
    for kind in ("coordl", "torch"):
        on, off = (statistics.median(res[(kind, o)]) for o in (True, False))
        span = {o: f"{min(res[(kind, o)]):.0f}-{max(res[(kind, o)]):.0f}" for o in (True, False)}
        print(f"  {kind}: in order {on:.0f} ({span[True]}), any order {off:.0f} ({span[False]}) samples/s: "
              f"{off / on - 1:+.1%} (medians of {rounds} alternated rounds)")  # fmt: skip


def probe_table(ds: Any, seeds: int) -> None:
    """The probes at ``seeds`` seeds against every item timed (warm), and skew_sim on every item."""
    measure_prep_spread(len(ds), ds.prep, ds.fetch, count=len(ds), budget_s=600)  # warm pass
    every = measure_prep_spread(len(ds), ds.prep, ds.fetch, count=len(ds), budget_s=600)
    rows = [("every item", every, {s: in_order_loss(every["cpu_s"], *s)["loss"] for s in SHAPES})]
    for seed in range(1, seeds + 1):
        probe = measure_prep_spread(len(ds), ds.prep, ds.fetch, seed=seed)
        rows.append(
            (f"probe seed {seed}", probe, {s: in_order_loss(probe["cpu_s"], *s)["loss"] for s in SHAPES})
        )
    head = ["", "items", "p50 ms", "p99 ms", "max ms", "p99/p50", "probe s"]
    head += [f"loss b{b} w{w}" for b, w in SHAPES]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for name, r, loss in rows:
        cells = [name, str(r["n"]), f"{r['p50_s'] * 1e3:.2f}", f"{r['p99_s'] * 1e3:.2f}", f"{r['max_s'] * 1e3:.1f}",
                 f"{r['p99_over_p50']:.1f}x", f"{r['seconds']:.2f}" if name != "every item" else "-"]  # fmt: skip
        print("| " + " | ".join(cells + [f"{loss[s]:.1%}" for s in SHAPES]) + " |")
    sim = {s: replay(every["cpu_s"], s[1], s[0], samples=200_000) for s in SHAPES}
    ref = [f"{1 - sim[s]['in_order'] / sim[s]['any_order']:.1%}" for s in SHAPES]
    print("| skew_sim on every item (200k samples) | | | | | | | " + " | ".join(ref) + " |")
    for s in SHAPES:
        vals = [loss[s] for _, _, loss in rows[1:]]
        print(f"batch {s[0]} workers {s[1]}: probes median {statistics.median(vals):.1%}, "
              f"range {min(vals):.1%}-{max(vals):.1%}; every item {rows[0][2][s]:.1%}")  # fmt: skip
    print(f"probe wall s: median {statistics.median(r['seconds'] for _, r, _ in rows[1:]):.2f}, "
          f"max {max(r['seconds'] for _, r, _ in rows[1:]):.2f}; p99/p50 of the probes "
          f"{np.round([r['p99_over_p50'] for _, r, _ in rows[1:]], 1).tolist()}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="photographs to build (default 1000)")
    ap.add_argument("--seeds", type=int, default=6, help="probe seeds (default 6)")
    ap.add_argument("--data", default=None, help="where to build them (default: a temporary directory)")
    ap.add_argument(
        "--measure", default="", help="BATCHxWORKERS: also measure in_order=False on both loaders"
    )
    ap.add_argument("--rounds", type=int, default=4, help="alternated rounds of --measure (default 4)")
    args = ap.parse_args()
    import coordl
    from coordl.datasets import photos

    with tempfile.TemporaryDirectory(prefix="check_skew_probe_") as tmp:
        root = photos.make_dataset(Path(args.data or tmp) / f"photos-{args.n}", n=args.n, classes=10, seed=0)
        ds = coordl.ImageFolder(root, transform=coordl.transforms.train_transform(224))
        probe_table(ds, args.seeds)
        if args.measure:
            batch, workers = (int(x) for x in args.measure.lower().split("x"))
            measure_in_order(ds, batch, workers, args.rounds)


if __name__ == "__main__":
    main()

"""Remote prep on Ray: does a remote core add to a prep-bound job's throughput, and ahead of Ray Data?

A prep-bound job (the standard recipe, 224 px, on ``--n`` synthetic JPEGs of ImageNet size): the
trainer and its local workers are pinned to core 0; a Ray cluster runs on this machine with its head
(``--num-cpus 0``) on core 0 and one prep node of one CPU on core 1 (tests/coordl/remote/ray_cluster.py,
token authentication on). Samples/s: the median of three epochs (after a warm-up epoch), for:

- ``local``: ``coordl.DataLoader`` with ``--workers`` local workers only (core 0's prep);
- ``remote only``: ``num_workers=0`` and ``remote_prep=`` (the remote core's prep through Ray);
- ``local + remote``: both: the target is >= 1.8x ``local``, and >= 90% of ``local + remote only``
  (the two cores' prep limits, measured in the same run);
- ``Ray Data``: ``ray.data.from_items(paths).map_batches(prep, batch_size=B, num_cpus=1)`` into
  ``iter_torch_batches`` on the same cluster (the same files, recipe and batch size).

Also: bytes over the link per remotely prepped sample (both ways), and the Ray path's cost per batch:
``remote only`` per batch minus ``main process`` per batch (the same prep, no workers, in the trainer).

    .venv/bin/python benchmarks/bench_remote_prep.py [--n 2000] [--batch 32] [--workers 1] [--depth 2]

``--photos``: every configuration (Ray Data aside) also on the photographic dataset of ``--n`` files
(``coordl synth --photos``), right after the synthetic one; a table per dataset.

Needs ``pip install 'coordl[ray]'`` (``[raydata]`` for the Ray Data row, left out without it) and two cores. On a shared machine, the numbers are
indicative only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

import coordl  # noqa: E402
from coordl.datasets.synth import make_dataset  # noqa: E402
from tests.coordl.remote.ray_cluster import RayCluster  # noqa: E402

EPOCHS = 3  # measured epochs per configuration, after a warm-up epoch


def _epoch(loader: Any) -> tuple[float, int]:
    """Seconds and samples of one pass."""
    start, n = time.perf_counter(), 0
    for x, _ in loader:
        n += len(x)
    return time.perf_counter() - start, n


def coordl_rate(root: str, workers: int, batch: int, remote: Any) -> tuple[float, dict[str, Any]]:
    dataset = coordl.ImageFolder(root, transform=coordl.transforms.train_transform(224))
    loader = coordl.DataLoader(
        dataset, batch_size=batch, shuffle=True, num_workers=workers,
        generator=torch.Generator().manual_seed(0), remote_prep=remote,
    )  # fmt: skip
    try:
        _epoch(loader)  # warm-up: workers, actors, page cache
        rates, stats = [], {}
        for _ in range(EPOCHS):  # the median epoch: one epoch is 2-3 s, a noisy neighbour moves it
            loader.reset_stats()
            seconds, n = _epoch(loader)
            rates.append(n / seconds)
            stats = loader.stats()
        return statistics.median(rates), stats
    finally:
        loader.close()


class RecipeBatch:
    """Ray Data's map_batches function: read and prep each file of the batch with the same recipe."""

    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.transform = coordl.transforms.train_transform(224)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        images = [self.transform(Path(p).read_bytes()) for p in batch["path"]]
        return {"image": torch.stack(images).numpy(), "label": batch["label"]}


def ray_data_rate(root: str, batch: int) -> float:
    import ray.data

    paths = sorted(str(p) for p in Path(root).rglob("*.jpg"))
    items = [{"path": p, "label": int(Path(p).parent.name.split("_")[-1])} for p in paths]
    ds = ray.data.from_items(items).map_batches(
        RecipeBatch, batch_size=batch, num_cpus=1, concurrency=1, batch_format="numpy"
    )
    rates = []
    for _ in range(1 + EPOCHS):  # the first pass is the warm-up
        start, n = time.perf_counter(), 0
        for b in ds.iter_torch_batches(batch_size=batch):
            n += len(b["label"])
        rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates[1:])


def _print_rows(rows: dict[str, float], both_stats: dict[str, Any], remote_stats: dict[str, Any],
                args: argparse.Namespace, kind: str) -> None:  # fmt: skip
    limit = rows["local"] + rows["remote only"]
    data = "JPEGs" if kind == "synth" else "photographs (coordl synth --photos)"
    print(f"\n{args.n} {data}, standard recipe 224 px, batch {args.batch}, {args.workers} local worker(s)\n")
    print("| configuration | samples/s | vs local |")
    print("|---|---:|---:|")
    for name, rate in rows.items():
        print(f"| {name} | {rate:.1f} | {rate / rows['local']:.2f}x |")
    print(
        f"\nlocal + remote vs the two cores' limits (local + remote only): {rows['local + remote'] / limit:.0%}"
    )
    if "Ray Data" in rows:
        print(f"local + remote vs Ray Data: {rows['local + remote'] / rows['Ray Data']:.2f}x")
    items = max(1, both_stats["remote_items"])
    moved = (both_stats["remote_bytes_sent"] + both_stats["remote_bytes_received"]) / items
    print(f"bytes over the link per remote sample: {moved / 1e3:.0f} KB "
          f"(sent {both_stats['remote_bytes_sent'] / items:.0f} B, "
          f"received {both_stats['remote_bytes_received'] / items / 1e3:.0f} KB, "
          f"read by the node {both_stats['remote_storage_bytes_read'] / items / 1e3:.0f} KB)")  # fmt: skip
    print(f"remote share of the items in local + remote: {both_stats['remote_items'] / args.n:.0%}")
    per_batch = {k: 1e3 * args.batch / rows[k] for k in ("remote only", "main process")}
    print(
        f"per batch: remote only {per_batch['remote only']:.1f} ms, main process {per_batch['main process']:.1f} ms: "
        f"Ray path {per_batch['remote only'] - per_batch['main process']:+.1f} ms per batch "
        f"({remote_stats['remote_batches']} remote batches)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="JPEGs in the dataset")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--workers", type=int, default=1, help="local workers (on core 0)")
    parser.add_argument("--depth", type=int, default=2, help="batches queued per actor (RemotePrep(depth=))")
    parser.add_argument("--data", default="/tmp/coordl_bench_remote", help="where the JPEGs are made")
    parser.add_argument("--photos", action="store_true",
                        help="also on the photographic dataset of --n files (coordl synth --photos), each "
                        "configuration's runs alternated with the synthetic ones (Ray Data: synthetic only)")  # fmt: skip
    args = parser.parse_args()
    if (os.cpu_count() or 1) < 2:
        print("needs two cores (one for the trainer, one for the Ray node)")
        return 2
    roots = {"synth": make_dataset(args.data, n=args.n, classes=10)}
    if args.photos:
        import datakind

        roots["photos"] = datakind.photos_root(args.n)
    os.sched_setaffinity(0, {0})  # the trainer and its local workers: core 0
    # torch sized its intra-op pool to the machine's cores at import; pinned to one core, two threads
    # contend for it (torch.stack of a 19 MB batch took 222 ms instead of 8): one core, one thread
    torch.set_num_threads(1)
    cluster = RayCluster()
    rows: dict[str, dict[str, float]] = {kind: {} for kind in roots}
    stats: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in roots}
    try:
        cluster.start_head()
        prep = coordl.RemotePrep(cluster.address, cpus=1, token=cluster.token, depth=args.depth)
        prep.connect()
        cluster.add_node(cores="1")
        configs = {"local": (args.workers, None), "main process": (0, None), "remote only": (0, prep),
                   "local + remote": (args.workers, prep)}  # fmt: skip
        for name, (workers, remote) in configs.items():
            for kind, root in roots.items():
                rows[kind][name], stats[kind][name] = coordl_rate(root, workers, args.batch, remote)
        try:
            rows["synth"]["Ray Data"] = ray_data_rate(roots["synth"], args.batch)
        except ImportError as e:  # ray[data] needs pandas and pyarrow (the raydata extra)
            print(f"Ray Data left out: {e} (pip install -e '.[raydata]')")
    finally:
        import ray

        ray.shutdown()
        cluster.stop()
    for kind in roots:
        _print_rows(rows[kind], stats[kind]["local + remote"], stats[kind]["remote only"], args, kind)
    return 0


if __name__ == "__main__":
    sys.exit(main())

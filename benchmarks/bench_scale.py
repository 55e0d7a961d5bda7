"""coordl at the item counts people train on: the cost curve of every path from 10^3 to 10^6 items.

Tiny items (16-byte files, no decode) so that the loader's own costs show. For each item count ``n``:

* ``listing``: a bare ``os.scandir`` walk of the folder tree beside ``coordl.ImageFolder(root)`` and
  ``coordl.FileListDataset(paths)`` built on it, and the bytes of the dataset as pickled for a spawned
  worker; at 10^7 (``--index-items``) ``FileListDataset`` over that many path strings (no files).
* ``loader``: 2 persistent workers, batch 256, shuffled: time to the first batch, steady items/s and CPU per
  item over up to ``--steady-items`` items, ``coordl.DataLoader(ImageFolder)`` beside
  ``torch.utils.data.DataLoader`` over a hand-written list dataset of the same files (what users write),
  alternated, median of ``--runs``; the main process's USS at the first batch and at the last.
* ``memory``: each worker's USS growth over one whole epoch (``benchmarks/scale_memory.py``), coordl beside
  the list dataset under torch's loader.
* ``state``: ``state_dict()`` half-way through an epoch: JSON bytes and time.
* every other path, from ``benchmarks/scale_paths.py``: the MinIO cache index, the partitioned cache's
  ownership, coordinated prep's control state, LMDB and tar packing and reading, ``nfs_cache`` staging, and
  ``dsanalyzer profile``.

    .venv/bin/python benchmarks/bench_scale.py [--items 1000 10000 100000 1000000] [--sections ...]

Writes ``reports/runs/bench_scale.json`` (every figure) and ``reports/bench_scale.png`` (the curves: per-item
cost against items, log-log). The folder trees are made once under ``--root`` and reused (10^6 files: about a
minute to write).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.utils.data

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scale_memory import ListDataset, make_tiny_tree, measure_worker_uss_growth, no_decode  # noqa: E402

import coordl  # noqa: E402

Metrics = dict[str, Any]
MB = 1 << 20
REPO = Path(__file__).resolve().parents[1]


def _walk(root: str) -> list[str]:
    """Every file under ``root`` (sorted by class folder), as a bare ``os.scandir`` walk lists them."""
    out: list[str] = []
    stack = [root]
    while stack:
        d = stack.pop()
        with os.scandir(d) as it:
            for e in it:
                if e.name.startswith("."):
                    continue
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                else:
                    out.append(e.path)
    return out


def listing(n: int, root: str, index_items: int) -> Metrics:
    """Listing and building datasets over the tree, against a bare walk."""
    t = time.perf_counter()
    paths = _walk(root)
    walk_s = time.perf_counter() - t
    t = time.perf_counter()
    folder = coordl.ImageFolder(root, transform=no_decode)
    folder_s = time.perf_counter() - t
    t = time.perf_counter()
    files = coordl.FileListDataset(paths, [0] * len(paths), transform=no_decode)
    filelist_s = time.perf_counter() - t
    out: Metrics = {
        "walk_s": walk_s, "imagefolder_build_s": folder_s, "filelist_build_s": filelist_s,
        "imagefolder_vs_walk": folder_s / walk_s,
        "imagefolder_pickle_bytes_per_item": len(pickle.dumps(folder)) / n,
        "filelist_pickle_bytes_per_item": len(pickle.dumps(files)) / n,
    }  # fmt: skip
    if index_items:  # the index alone, at a scale no folder here holds
        names = [f"/data/train/n{i % 1000:08d}/{i:09d}.JPEG" for i in range(index_items)]
        t = time.perf_counter()
        big = coordl.FileListDataset(names, [i % 1000 for i in range(index_items)], transform=no_decode)
        out["index_items"] = index_items
        out["index_build_s"] = time.perf_counter() - t
        out["index_pickle_bytes_per_item"] = len(pickle.dumps(big)) / index_items
        del big, names
        gc.collect()
    return out


def _one_pass(make: Callable[[], Any], steady_items: int) -> Metrics:
    """First batch, then steady items/s and CPU per item over up to ``steady_items`` items."""
    me = psutil.Process()
    before = {c.pid for c in me.children()}
    loader = make()
    t0 = time.perf_counter()
    it = iter(loader)
    first = next(it)
    first_s = time.perf_counter() - t0
    main_start = me.memory_full_info().uss
    workers = [c for c in me.children() if c.pid not in before]
    cpu0 = time.process_time() + sum(_cpu(w) for w in workers)
    t1, items = time.perf_counter(), 0
    for batch in it:
        items += len(batch[0])
        if items >= steady_items:
            break
    wall = time.perf_counter() - t1
    cpu = time.process_time() + sum(_cpu(w) for w in workers) - cpu0
    main_end = me.memory_full_info().uss
    del first, it
    if hasattr(loader, "close"):
        loader.close()
    else:  # torch's: stop its persistent workers now
        live = getattr(loader, "_iterator", None)
        if live is not None:
            live._shutdown_workers()
    return {
        "first_batch_s": first_s, "items_per_s": items / wall, "cpu_us_per_item": cpu / items * 1e6,
        "main_uss_growth_bytes": main_end - main_start,
    }  # fmt: skip


def _cpu(p: psutil.Process) -> float:
    try:
        t = p.cpu_times()
        return t.user + t.system
    except psutil.Error:
        return 0.0


def loader(n: int, root: str, runs: int, steady_items: int) -> Metrics:
    """coordl.DataLoader(ImageFolder) against torch's loader over a list dataset, alternated."""
    kw = {"batch_size": 256, "shuffle": True, "num_workers": 2, "persistent_workers": True}
    folder = coordl.ImageFolder(root, transform=no_decode)
    listed = ListDataset(root)
    makers = {
        "coordl": lambda: coordl.DataLoader(folder, generator=torch.Generator().manual_seed(0), **kw),
        "torch": lambda: torch.utils.data.DataLoader(
            listed, generator=torch.Generator().manual_seed(0), **kw
        ),
    }
    got: dict[str, list[Metrics]] = {k: [] for k in makers}
    for _ in range(runs):
        for name, make in makers.items():
            got[name].append(_one_pass(make, min(steady_items, n - 256)))
    out: Metrics = {}
    for name, rows in got.items():
        for key in rows[0]:
            out[f"{name}_{key}"] = statistics.median(r[key] for r in rows)
    rates = [c["items_per_s"] / t["items_per_s"] for c, t in zip(got["coordl"], got["torch"], strict=True)]
    out["coordl_vs_torch_items_per_s"] = statistics.median(rates)
    out["coordl_vs_torch_spread"] = [min(rates), max(rates)]
    return out


def memory(n: int, root: str) -> Metrics:
    """Each worker's USS growth over a whole epoch (2 workers)."""
    folder = lambda: coordl.ImageFolder(root, transform=no_decode)  # noqa: E731
    c = measure_worker_uss_growth(folder, coordl.DataLoader, 2)
    t = measure_worker_uss_growth(lambda: ListDataset(root), torch.utils.data.DataLoader, 2)
    return {
        "coordl_worker_uss_growth_mb": c.max_growth_bytes / MB,
        "torch_list_worker_uss_growth_mb": t.max_growth_bytes / MB,
        "coordl_worker_growth_bytes_per_item": c.max_growth_bytes / n,
        "torch_list_worker_growth_bytes_per_item": t.max_growth_bytes / n,
    }


def state(n: int, root: str) -> Metrics:
    """``state_dict()`` half-way through an epoch, 2 workers: JSON bytes and median time of 5 calls."""
    dl = coordl.DataLoader(
        coordl.ImageFolder(root, transform=no_decode), batch_size=256, shuffle=True, num_workers=2,
    )  # fmt: skip
    try:
        it = iter(dl)
        for _ in range(max(1, len(dl) // 2)):
            next(it)
        times = []
        for _ in range(5):
            t = time.perf_counter()
            s = dl.state_dict()
            times.append(time.perf_counter() - t)
        return {"state_json_bytes": len(json.dumps(s)), "state_dict_s": statistics.median(times)}
    finally:
        dl.close()


def _path_sections() -> dict[str, tuple[Callable[[int, Path], Metrics], int]]:
    try:
        import scale_paths
    except ImportError as error:  # (the paths' module is optional while it is written)
        print(f"bench_scale: benchmarks/scale_paths.py not importable ({error}); its sections skipped")
        return {}
    return dict(scale_paths.SECTIONS)


CORE = ("listing", "loader", "memory", "state")


def run(args: argparse.Namespace) -> dict[str, dict[str, Metrics]]:
    paths = _path_sections()
    wanted = args.sections or [*CORE, *paths]
    results: dict[str, dict[str, Metrics]] = {}
    for n in args.items:
        root = os.path.join(args.root, f"tiny-{n}")
        if any(s in CORE for s in wanted):
            t = time.perf_counter()
            make_tiny_tree(root, n, classes=min(1000, max(10, n // 1000)))
            print(f"[n={n}] tree ready in {time.perf_counter() - t:.1f} s", flush=True)
        for name in wanted:
            t = time.perf_counter()
            try:
                if name == "listing":
                    got = listing(n, root, args.index_items if n == max(args.items) else 0)
                elif name == "loader":
                    got = loader(n, root, args.runs, args.steady_items)
                elif name == "memory":
                    got = memory(n, root)
                elif name == "state":
                    got = state(n, root)
                elif name in paths:
                    fn, max_n = paths[name]
                    if n > max_n:
                        continue
                    with tempfile.TemporaryDirectory(prefix=f"coordl-scale-{name}-") as work:
                        got = fn(n, Path(work))
                else:
                    raise SystemExit(f"bench_scale: unknown section {name!r} (have {[*CORE, *paths]})")
            except Exception as error:  # a path that fails at this size is a result too
                got = {"error": f"{type(error).__name__}: {error}"}
            got["section_s"] = time.perf_counter() - t
            results.setdefault(name, {})[str(n)] = got
            print(f"[n={n}] {name}: {_brief(got)}", flush=True)
            gc.collect()
    return results


def _brief(m: Metrics) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    return ", ".join(f"{k}={fmt(v)}" for k, v in m.items())


def table(results: dict[str, dict[str, Metrics]]) -> str:
    """One row per section and figure, one column per item count."""
    counts = sorted({int(n) for sec in results.values() for n in sec})
    lines = ["| section | figure | " + " | ".join(f"{n:,}" for n in counts) + " |"]
    lines.append("|---|---|" + "---|" * len(counts))
    for name, by_n in results.items():
        keys: list[str] = []
        for m in by_n.values():
            keys += [k for k in m if k not in keys and k != "section_s"]
        for k in keys:
            cells = []
            for n in counts:
                v = by_n.get(str(n), {}).get(k, "")
                cells.append(f"{v:.4g}" if isinstance(v, float) else str(v))
            lines.append(f"| {name} | {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: dict[str, dict[str, Metrics]], out: Path) -> None:
    """Per-item figures against items, log-log, bytes and microseconds apart: a flat line grows with the
    item count and no faster."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bytes_ax, time_ax) = plt.subplots(1, 2, figsize=(15, 6.5))
    for name, by_n in results.items():
        keys = {
            k for m in by_n.values() for k in m if k.endswith("per_item") and isinstance(m[k], (int, float))
        }
        for k in sorted(keys):
            ax, scale = (bytes_ax, 1.0) if "bytes" in k else (time_ax, 1.0 if "_us_" in k else 1e6)
            if ax is time_ax and "_s_per_item" not in k and "_us_per_item" not in k:
                continue
            pts = sorted(
                (int(n), m[k] * scale)
                for n, m in by_n.items()
                if isinstance(m.get(k), (int, float)) and m[k] > 0
            )
            if len(pts) >= 2:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{name}: {k}")
    for ax, unit in ((bytes_ax, "bytes per item"), (time_ax, "microseconds per item")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("items")
        ax.set_ylabel(unit)
        ax.legend(fontsize=6, loc="best")
    fig.suptitle("coordl at scale: per-item costs (flat = grows with the item count, no faster)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, nargs="+", default=[1000, 10000, 100000, 1000000])
    ap.add_argument("--sections", nargs="*", help="default: all")
    ap.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "coordl-scale"))
    ap.add_argument("--runs", type=int, default=3, help="alternated runs of the loader section (median)")
    ap.add_argument("--steady-items", type=int, default=200_000, help="items timed per loader run")
    ap.add_argument(
        "--index-items", type=int, default=10_000_000, help="listing: an index of this many paths"
    )
    ap.add_argument("--out", default=str(REPO / "reports" / "runs" / "bench_scale.json"))
    ap.add_argument("--plot", default=str(REPO / "reports" / "bench_scale.png"))
    args = ap.parse_args(argv)
    results = run(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    host = {"cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(args.out).write_text(json.dumps({"host": host, "results": results}, indent=1))
    print(table(results))
    if args.plot:
        plot(results, Path(args.plot))
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()

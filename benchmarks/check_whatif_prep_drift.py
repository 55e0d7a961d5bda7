"""Check of the what-if's bias at a partial MinIO cache (reports/bench_whatif.md, session 9).

Measures, within one minute and with bench_whatif_accuracy's own source, storage and loader: the prep
rate P(1), one emulated read, and the 1-worker rate with no cache (every item a miss) and with 25% of
the items cached, then prints each rate beside the what-if's per-worker cycle 1/((1-h) * read + 1/P(1)).
If the model matches here, a gap in the benchmark is in its profile's measurements, not a cost per miss.

Run from the repository root: ``.venv/bin/python benchmarks/check_whatif_prep_drift.py`` (about 1 minute).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_whatif_accuracy as bench  # noqa: E402

ITEMS, ITEM_BYTES, PREP_S, STORAGE_MBPS = 480, 32_000, 2.5e-3, 8.0


class _Args:
    batch, skip, items = 16, 3, ITEMS


def rate(storage_mbps: float, cache_bytes: int) -> float:
    """Steady samples/s of one worker over the benchmark's source, median of 3 epochs after a cold one."""
    src = bench.SyntheticSource(ITEMS, ITEM_BYTES, PREP_S, bench.EmulatedStorage(storage_mbps * 1e6))
    with bench._loader(src, _Args(), 1, cache_bytes) as loader:
        for _ in loader:  # cold epoch: fills the cache
            pass
        return statistics.median(bench._steady_rate(loader, None, _Args.skip) for _ in range(3))


def main() -> None:
    p1 = rate(0.0, 0)  # prep alone: no storage device
    store = bench.EmulatedStorage(STORAGE_MBPS * 1e6)
    t0 = time.perf_counter()
    for _ in range(60):
        store.read(ITEM_BYTES)
    read_s = (time.perf_counter() - t0) / 60
    print(f"P(1) = {p1:.1f}/s ({1e3 / p1:.3f} ms per item), one read = {read_s * 1e3:.3f} ms")
    for label, hit in (("no cache", 0.0), ("25% cached", 0.25)):
        measured = rate(STORAGE_MBPS, int(ITEMS * ITEM_BYTES * hit))
        model = 1.0 / ((1 - hit) * read_s + 1.0 / p1)
        print(f"{label:>10}: measured {measured:.1f}/s, model {model:.1f}/s ({model / measured - 1:+.1%})")


if __name__ == "__main__":
    main()

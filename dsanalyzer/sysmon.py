"""Background sampler of machine-wide resource use during a profiled run.

Samples, every ``interval_s``: CPU utilisation per core, cumulative disk read bytes and page-cache
size (psutil). The series go into the report so that a reader can see *why* a run was slow (cores
saturated by prep, disk reading at full speed, page cache filling up) rather than only that it was.
Machine-wide on purpose: DataLoader workers are separate processes.
"""

from __future__ import annotations

import threading
import time

import psutil

__all__ = ["SysMonitor", "concat_series"]


def _disk_read_bytes() -> int:
    counters = psutil.disk_io_counters()
    return int(counters.read_bytes) if counters is not None else 0


def _page_cache_bytes() -> int:
    vm = psutil.virtual_memory()
    # "cached" exists on Linux; elsewhere report 0 rather than a number that means something else.
    return int(getattr(vm, "cached", 0) or 0)


class SysMonitor:
    """Samples CPU per core, disk read bytes and page cache in a daemon thread.

    Use as a context manager; ``series()`` returns the samples as plain lists (JSON-ready).
    """

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.t_s: list[float] = []
        self.cpu_percent_per_core: list[list[float]] = []
        self.disk_read_bytes: list[int] = []
        self.page_cache_bytes: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def _sample(self) -> None:
        self.t_s.append(round(time.monotonic() - self._t0, 3))
        # interval=None: utilisation since the previous call, so sampling never blocks.
        self.cpu_percent_per_core.append([float(x) for x in psutil.cpu_percent(interval=None, percpu=True)])
        self.disk_read_bytes.append(_disk_read_bytes())
        self.page_cache_bytes.append(_page_cache_bytes())

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def start(self) -> SysMonitor:
        self._t0 = time.monotonic()
        psutil.cpu_percent(interval=None, percpu=True)  # prime the per-core counters
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="dsanalyzer-sysmon", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        self._sample()

    def __enter__(self) -> SysMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def series(self) -> dict:
        """The samples: ``t_s``, ``cpu_percent_per_core``, ``disk_read_bytes``, ``page_cache_bytes``."""
        return {
            "t_s": list(self.t_s),
            "cpu_percent_per_core": [list(r) for r in self.cpu_percent_per_core],
            "disk_read_bytes": list(self.disk_read_bytes),
            "page_cache_bytes": list(self.page_cache_bytes),
        }


def concat_series(parts: list[dict]) -> dict:
    """Join the series of consecutive runs into one, shifting each run's times after the previous."""
    out: dict = {"t_s": [], "cpu_percent_per_core": [], "disk_read_bytes": [], "page_cache_bytes": []}
    offset = 0.0
    for part in parts:
        ts = part.get("t_s", [])
        out["t_s"].extend(round(offset + t, 3) for t in ts)
        for key in ("cpu_percent_per_core", "disk_read_bytes", "page_cache_bytes"):
            out[key].extend(part.get(key, []))
        if ts:
            offset += ts[-1]
    return out

"""Background sampler of machine-wide resource use during a profiled run.

Samples, every ``interval_s``: CPU utilisation per core, disk bytes read since the monitor started
(the machine's counter is absolute), page-cache size, and the cores used by processes *outside* the
job (busy CPU time of the machine minus that of this process and its descendants: the profiled
command and its loader workers), which is how the verdict tells interference from a slow job. The series go into the report so that a reader can see *why* a run was slow (cores
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


def _busy_cpu_s() -> float:
    t = psutil.cpu_times()
    return float(t.user + t.system + getattr(t, "nice", 0) + getattr(t, "irq", 0) + getattr(t, "softirq", 0))


def _job_cpu_s() -> float:
    """CPU seconds of this process and its descendants (reaped children count through their parent)."""
    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


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
        self.other_cpu_cores: list[float | None] = []
        self._last_cpu: tuple[float, float, float] | None = None
        self._disk0 = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def _sample(self) -> None:
        self.t_s.append(round(time.monotonic() - self._t0, 3))
        # interval=None: utilisation since the previous call, so sampling never blocks.
        self.cpu_percent_per_core.append([float(x) for x in psutil.cpu_percent(interval=None, percpu=True)])
        self.disk_read_bytes.append(_disk_read_bytes() - self._disk0)
        self.page_cache_bytes.append(_page_cache_bytes())
        now, busy, job = time.monotonic(), _busy_cpu_s(), _job_cpu_s()
        other = None
        if self._last_cpu is not None and now > self._last_cpu[0]:
            dt = now - self._last_cpu[0]
            other = max(0.0, ((busy - self._last_cpu[1]) - (job - self._last_cpu[2])) / dt)
        self.other_cpu_cores.append(other)
        self._last_cpu = (now, busy, job)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def start(self) -> SysMonitor:
        self._t0 = time.monotonic()
        self._disk0 = _disk_read_bytes()
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
        """The samples: ``t_s``, ``cpu_percent_per_core``, ``disk_read_bytes`` (since start),
        ``page_cache_bytes``, ``other_cpu_cores``."""
        return {
            "t_s": list(self.t_s),
            "cpu_percent_per_core": [list(r) for r in self.cpu_percent_per_core],
            "disk_read_bytes": list(self.disk_read_bytes),
            "page_cache_bytes": list(self.page_cache_bytes),
            "other_cpu_cores": list(self.other_cpu_cores),
        }


def concat_series(parts: list[dict]) -> dict:
    """Join the series of consecutive runs into one, shifting each run's times after the previous."""
    keys = ("cpu_percent_per_core", "disk_read_bytes", "page_cache_bytes", "other_cpu_cores")
    out: dict = {"t_s": [], **{k: [] for k in keys}}
    offset = 0.0
    read_before = 0
    for part in parts:
        ts = part.get("t_s", [])
        out["t_s"].extend(round(offset + t, 3) for t in ts)
        for key in ("cpu_percent_per_core", "page_cache_bytes"):
            out[key].extend(part.get(key, []))
        out["other_cpu_cores"].extend(part.get("other_cpu_cores") or [None] * len(ts))
        read = part.get("disk_read_bytes", [])
        out["disk_read_bytes"].extend(read_before + r for r in read)  # cumulative over the runs
        read_before += read[-1] if read else 0
        if ts:
            offset += ts[-1]
    return out

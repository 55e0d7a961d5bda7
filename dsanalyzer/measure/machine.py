"""The machine a profile ran on: the report's ``machine`` section.

Its cores (the affinity mask the job got), memory, the device and file system under the dataset, and what the
probes measured here (memory bandwidth, :mod:`dsanalyzer.measure.membw`; OpenMP's spin after a parallel
region, :mod:`dsanalyzer.measure.ompspin`).
"""

from __future__ import annotations

import os

import psutil

__all__ = ["available_cpus", "storage_device", "machine_section"]


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def storage_device(path: str | None) -> dict:
    """The device, file system and mount point that hold ``path`` (all None for a bucket or an unknown path)."""
    if not path or "://" in path:  # a bucket (the report's ``source``) is on no local device
        return {"device": None, "fstype": None, "mountpoint": None}
    best = None
    real = os.path.realpath(path)
    for part in psutil.disk_partitions(all=True):
        mp = part.mountpoint
        if (real == mp or real.startswith(mp.rstrip("/") + "/")) and (
            best is None or len(mp) > len(best.mountpoint)
        ):
            best = part
    if best is None:
        return {"device": None, "fstype": None, "mountpoint": None}
    return {"device": best.device, "fstype": best.fstype, "mountpoint": best.mountpoint}


def machine_section(
    dataset: dict, mem_bw: float, storage_note: str | None, compute_note: str | None, omp_spin: dict | None
) -> dict:
    """The report's ``machine`` section: cores, memory, the dataset's device, memory bandwidth, OpenMP's spin."""
    return {
        "cpus": available_cpus(),
        "memory_bytes": int(psutil.virtual_memory().total),
        "storage_device": storage_device(dataset.get("path")),
        "storage_note": storage_note,
        "compute_note": compute_note,
        "mem_bandwidth_bytes_per_s": mem_bw,
        # how long torch's idle intra-op threads spin after a region here (measure/ompspin.py; None: unknown)
        "omp_spin_s": None if omp_spin is None else omp_spin.get("spin_s"),
        "omp_spin": omp_spin,
    }

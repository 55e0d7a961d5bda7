"""Emulated slow storage for ``dsanalyzer demo``: a documented rate limit on the demo dataset's reads.

A laptop or CI machine reads a small dataset from its page cache at GB/s, so a demo there shows no
fetch stall. Throttling the device needs root (cgroups, loop devices: ``benchmarks/slowstore.py``);
the demo instead emulates one in user space:

* **one device, shared**: every read of an item waits its turn on an emulated device that transfers
  ``rate_bytes_per_s``; all readers (loader workers, their read-ahead threads, dsanalyzer's fetch-rate
  probe) queue on the same device through a lock file holding the time the device is next free
  (``CLOCK_MONOTONIC`` is one clock for all processes). So N readers share the rate, as on a disk.
* **no page cache**: the emulated device has no cache in front of it; every read pays. This is the
  job on a server whose dataset is far larger than the memory it may use for the page cache (the
  profile is told so with ``page_cache_bytes=0``).

The report labels the storage as emulated, with the rate.
"""

from __future__ import annotations

import fcntl
import os
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

import coordl

__all__ = ["EmulatedDevice", "RateLimitedImageFolder", "device_path"]

_FMT = "d"  # the monotonic time at which the device is next free


def device_path() -> Path:
    """The lock file of the emulated device (one per user)."""
    return Path(tempfile.gettempdir()) / f"dsanalyzer-demo-device-{os.getuid()}"


class EmulatedDevice:
    """A serial device of ``rate_bytes_per_s`` shared by every process that opens the same ``path``."""

    def __init__(self, rate_bytes_per_s: float, path: str | os.PathLike | None = None) -> None:
        if not rate_bytes_per_s > 0:
            raise ValueError(f"rate_bytes_per_s must be positive, got {rate_bytes_per_s}")
        self.rate_bytes_per_s = float(rate_bytes_per_s)
        self.path = str(path or device_path())

    def transfer(self, nbytes: int) -> float:
        """Queue ``nbytes`` on the device and sleep until they are transferred; returns seconds waited."""
        t0 = time.monotonic()
        # A new open file description per call: flock then excludes threads of one process too.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.pread(fd, struct.calcsize(_FMT), 0)
            free_at = struct.unpack(_FMT, raw)[0] if len(raw) == struct.calcsize(_FMT) else 0.0
            done_at = max(t0, free_at) + nbytes / self.rate_bytes_per_s
            os.pwrite(fd, struct.pack(_FMT, done_at), 0)
        finally:
            os.close(fd)  # closing releases the lock
        delay = done_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        return time.monotonic() - t0


class RateLimitedImageFolder(coordl.ImageFolder):
    """``coordl.ImageFolder`` whose reads go through an :class:`EmulatedDevice`."""

    def __init__(self, root: str, rate_bytes_per_s: float, **kwargs: Any) -> None:
        super().__init__(root, **kwargs)
        self.device = EmulatedDevice(rate_bytes_per_s)

    def fetch(self, index: int) -> bytes:
        raw = super().fetch(index)
        self.device.transfer(len(raw))
        return raw

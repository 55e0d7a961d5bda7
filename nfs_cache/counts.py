"""What one process's ``StagedSource`` did: its remote reads, the copies it made, replaced or could not make.

Counted per process under a lock (DataLoader workers read from threads too). ``remote_bytes_read`` is also
added to the shared counters a caller gives (coordl's ``SharedCounters``), so that the reads of every
DataLoader worker add up to one node-wide figure.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["StageCounts"]


class StageCounts:
    """This process's counts; ``counters``: optional object with ``.add(name, amount)`` (and ``.snapshot()``)."""

    def __init__(self, counters: Any = None) -> None:
        self.counters = counters
        self._lock = threading.Lock()
        self._local = {"remote_bytes_read": 0, "corrupt_staged": 0, "staged_here": 0, "unstaged_reads": 0}

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._local[name] += amount
        if name == "remote_bytes_read" and self.counters is not None:
            self.counters.add("remote_bytes_read", amount)

    def local(self) -> dict[str, int]:
        """A copy of this process's counts."""
        with self._lock:
            return dict(self._local)

    def remote_bytes_read(self) -> int:
        """Remote bytes read by all processes when the shared counters can tell, else by this one."""
        remote = self.local()["remote_bytes_read"]
        snapshot = getattr(self.counters, "snapshot", None)
        if snapshot is not None:
            remote = int(snapshot().get("remote_bytes_read", remote))
        return remote

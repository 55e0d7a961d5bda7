"""Whole shards fetched from a bucket with one GET each and kept in memory while their samples are read.

Why whole shards and not a ranged GET per sample: a ranged GET costs one request, its price and its round trip,
exactly as a loose file does, so shards read by ranges save nothing on an object store. A whole shard (10-100
MB) is one request whose latency is amortised over hundreds of samples and whose transfer runs at the link's
rate. Memory is the cost: each process keeps at most ``max_shards`` shards (least recently used go first), so
the order of reads must stay within a few shards at a time: :class:`coordl.data.ShardSampler` shuffles shards
and then samples within a window of shards, as Mosaic Streaming, WebDataset and LitData do. (A shard may also
be staged whole to local disk or ``/dev/shm`` with ``stage_dir=``; then it is fetched once per node.)

Thread-safe: fetch-ahead threads asking for the same shard wait for one GET instead of making several.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable

__all__ = ["ShardBuffer", "DEFAULT_MEMORY_SHARDS"]

DEFAULT_MEMORY_SHARDS = 4


class ShardBuffer:
    """The last ``max_shards`` shards read, as bytes, per process; ``get(name)`` fetches a shard once."""

    def __init__(self, fetch: Callable[[str], bytes], max_shards: int = DEFAULT_MEMORY_SHARDS) -> None:
        if max_shards < 1:
            raise ValueError(f"ShardBuffer: max_shards must be at least 1, got {max_shards}")
        self.fetch = fetch
        self.max_shards = max_shards
        self._reset()

    def _reset(self) -> None:
        self._shards: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._inflight: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def __getstate__(self) -> dict:
        return {"fetch": self.fetch, "max_shards": self.max_shards}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

    def get(self, name: str) -> bytes:
        """Shard ``name``'s bytes: from memory, or fetched now (other threads wanting it wait for this fetch)."""
        if self._pid != os.getpid():  # a forked worker: the parent's shards and locks are not ours
            self._reset()
        while True:
            with self._lock:
                data = self._shards.get(name)
                if data is not None:
                    self._shards.move_to_end(name)
                    return data
                event = self._inflight.get(name)
                if event is None:
                    event = self._inflight[name] = threading.Event()
                    break
            event.wait()  # another thread fetches it; look again (it may have failed: then fetch ourselves)
        try:
            data = self.fetch(name)
            with self._lock:
                self._shards[name] = data
                while len(self._shards) > self.max_shards:
                    self._shards.popitem(last=False)
            return data
        finally:
            with self._lock:
                self._inflight.pop(name, None)
            event.set()

    def slice(self, name: str, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` of shard ``name`` (a short result means the shard is shorter)."""
        return bytes(memoryview(self.get(name))[offset : offset + size])

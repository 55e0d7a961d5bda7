"""Whether a loader's storage reads go through the OS page cache, decided from the memory it has.

MinIO keeps the items it caches in shared memory. What it does not keep is read from storage every
epoch, and whether the OS page cache helps those reads depends on memory: when the rest of the dataset
fits in the memory left for the page cache, the page cache serves them from the second epoch on; when it
does not, random access thrashes it (the CoorDL paper's finding), and every read costs a page-cache
insertion and a reclaim for nothing. Then the loader reads past the page cache
(:func:`coordl.fileread.read.read_file` with ``cached=False``).

``page_cache="auto"`` (the default) decides, in each worker process, from:

* the bytes outside the cache: the dataset's size, estimated as ``len(dataset)`` x the mean size of the
  items cached so far, less the MinIO budget;
* the room for the page cache (:func:`page_cache_room`): the smaller of the kernel's ``MemAvailable``
  and, in a memory cgroup (v1 or v2), its limit less its usage plus the file pages it holds, at every
  level up to the root.

It reads past the page cache when the first is larger, and looks again every :data:`RECHECK_READS`
storage reads. Only with a MinIO cache of its own (not partitioned, where peers serve the misses) and a
source that can read past it (``fetch_uncached``: ``coordl.ImageFolder``, ``FileListDataset`` and the
torchvision adapter). ``"use"``: always through the page cache (torch's behaviour); ``"bypass"``: always
past it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

__all__ = ["PAGE_CACHE_MODES", "RECHECK_READS", "PageCachePolicy", "check_mode", "page_cache_room"]

PAGE_CACHE_MODES = ("auto", "use", "bypass")
RECHECK_READS = 512  # storage reads between two looks at the memory (each look reads 3-4 small files)


def check_mode(mode: object) -> None:
    """Refuse a ``page_cache`` value that is not one of :data:`PAGE_CACHE_MODES`, naming the option."""
    if mode not in PAGE_CACHE_MODES:
        raise ValueError(f"page_cache must be one of {', '.join(map(repr, PAGE_CACHE_MODES))}, got {mode!r}")


def page_cache_room(proc: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> int:
    """Bytes the page cache of this process could hold: ``MemAvailable``, bounded by every memory cgroup
    it is in (limit - usage + file pages, at each level up to the root)."""
    room = _meminfo_available(proc)
    for limit, usage, file_bytes in _cgroup_levels(proc, cgroup_root):
        room = min(room, max(0, limit - usage) + file_bytes)
    return room


def _meminfo_available(proc: str) -> int:
    try:
        with open(os.path.join(proc, "meminfo")) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 62  # unknown: no bound from here


def _cgroup_levels(proc: str, root: str) -> list[tuple[int, int, int]]:
    """(limit, usage, file bytes) of each limited memory cgroup level of this process, leaf first."""
    try:
        with open(os.path.join(proc, "self", "cgroup")) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if "memory" in controllers.split(","):  # v1
            base, names = os.path.join(root, "memory"), ("memory.limit_in_bytes", "memory.usage_in_bytes")
        elif controllers == "":  # v2 (unified)
            base, names = root, ("memory.max", "memory.current")
        else:
            continue
        rel = path.strip("/")
        while True:
            level = _level(os.path.join(base, rel), *names)
            if level is not None:
                out.append(level)
            if not rel:
                break
            rel = os.path.dirname(rel)
    return out


def _level(directory: str, limit_name: str, usage_name: str) -> tuple[int, int, int] | None:
    try:
        with open(os.path.join(directory, limit_name)) as f:
            text = f.read().strip()
        if text == "max":
            return None
        limit = int(text)
        if limit >= 1 << 60:  # v1's "no limit" (a page-rounded LLONG_MAX)
            return None
        with open(os.path.join(directory, usage_name)) as f:
            usage = int(f.read())
        stat = {}
        with open(os.path.join(directory, "memory.stat")) as f:
            for line in f:
                key, _, value = line.partition(" ")
                stat[key] = int(value)
    except (OSError, ValueError):
        return None
    return limit, usage, stat.get("active_file", 0) + stat.get("inactive_file", 0)


class PageCachePolicy:
    """Decides, for one worker process, whether its storage reads go past the page cache.

    Args:
        mode: ``"auto"``, ``"use"`` or ``"bypass"`` (see the module docs).
        minio: the loader's own MinIO cache (``capacity_bytes``, ``stats()``), or None.
        num_items: the dataset's length.
        room: how much the page cache could hold (default :func:`page_cache_room`; tests pass their own).
    """

    def __init__(self, mode: str, minio: Any, num_items: int, room: Callable[[], int] | None = None) -> None:
        check_mode(mode)
        self.mode = mode
        self.minio = minio
        self.num_items = num_items
        self._room = room
        self._bypass = mode == "bypass"
        self._until_look = 0  # storage reads until the next look ("auto")
        self.outside_bytes: int | None = None  # what the last look saw (for stats and tests)
        self.room_bytes: int | None = None

    def bypass(self) -> bool:
        """Whether the next storage read goes past the page cache (counts the read)."""
        if self.mode != "auto" or self.minio is None:
            return self._bypass
        if self._until_look <= 0:
            self._look()
        self._until_look -= 1
        return self._bypass

    def _look(self) -> None:
        stats = self.minio.stats()
        items, cached = stats.get("cached_items", 0), stats.get("cached_bytes", 0)
        # estimate early (from the first cached item on), then settle
        self._until_look = RECHECK_READS if items >= 64 else 16 if items else 1
        if items == 0:
            return  # nothing to estimate the item size from yet: the page cache, as before
        self.outside_bytes = max(0, cached * self.num_items // items - self.minio.capacity_bytes)
        self.room_bytes = (self._room or page_cache_room)()
        self._bypass = self.outside_bytes > self.room_bytes

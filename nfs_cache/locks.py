"""Node-wide locks that make each file be copied once, however many workers and jobs stage the same directory.

Striped ``flock`` locks: a path hashes to one of ``stripes`` lock files under the stage directory. ``flock``
belongs to an open file description, so threads of one process exclude each other as well as processes do, and the
kernel drops a lock when its holder dies (``kill -9`` included): no stale lock ever needs cleaning. Striping
bounds the number of lock files; two paths that share a stripe merely wait for each other.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
import zlib
from collections.abc import Iterator

__all__ = ["StripedLocks"]


class StripedLocks:
    """``hold(key, timeout_s)``: an exclusive lock on ``key``'s stripe, waited for at most ``timeout_s``."""

    def __init__(self, directory: str, stripes: int = 1024) -> None:
        self.directory = directory
        self.stripes = stripes
        os.makedirs(directory, exist_ok=True)

    def path_for(self, key: str) -> str:
        return os.path.join(self.directory, f"{zlib.crc32(key.encode()) % self.stripes:04d}.lock")

    @contextlib.contextmanager
    def hold(self, key: str, timeout_s: float) -> Iterator[None]:
        path = self.path_for(key)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            deadline = time.monotonic() + timeout_s
            delay_s = 0.001
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise TimeoutError(
                            f"waited {timeout_s:.0f} s for the staging lock of {key!r} ({path}); "
                            "another process is copying it and is stuck (raise lock_timeout_s for huge files)"
                        ) from None
                    time.sleep(delay_s)
                    delay_s = min(delay_s * 2, 0.05)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

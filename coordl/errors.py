"""Errors coordl raises, each naming the item, file or option at fault."""

from __future__ import annotations

__all__ = ["CoordlError", "CorruptItemError", "WorkerDiedError", "CoordlTimeoutError"]


class CoordlError(RuntimeError):
    """Base class of coordl's own errors."""


class CorruptItemError(CoordlError, ValueError):
    """An item's bytes could not be decoded. ``path`` names the file, ``index`` the item."""

    def __init__(self, message: str, *, path: str | None = None, index: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.index = index

    def __reduce__(self):  # survives the trip from a worker process to the main process
        return (_rebuild_corrupt, (str(self), self.path, self.index))


def _rebuild_corrupt(message: str, path: str | None, index: int | None) -> CorruptItemError:
    return CorruptItemError(message, path=path, index=index)


class WorkerDiedError(CoordlError):
    """A loader worker process died (killed, segfault, out of memory) while preparing an item."""


class CoordlTimeoutError(CoordlError, TimeoutError):
    """A wait (for a batch, a peer, a job of the group) ran past its timeout."""

"""Errors coordl raises, each naming the item, file or option at fault."""

from __future__ import annotations

import os
import re

__all__ = ["CoordlError", "CorruptItemError", "WorkerDiedError", "CoordlTimeoutError"]


class CoordlError(RuntimeError):
    """Base class of coordl's own errors."""


class CorruptItemError(CoordlError, ValueError):
    """An item's bytes could not be decoded. ``path`` names the file, ``index`` the item."""

    def __init__(self, message: str, *, path: str | None = None, index: int | None = None) -> None:
        self.worker_traceback: str | None = None
        self.where: str | None = None  # "DataLoader worker process N" when torch re-raised it from there
        if path is None and message.startswith(_TORCH_WORKER_PREFIX):
            message, path, found, self.where, self.worker_traceback = _from_torch_worker(message)
            index = found if index is None else index
        item = _ITEM_SUFFIX.search(message)
        if item is not None:  # "(item N)" that __str__ added on the way here
            message = message[: item.start()]
            index = int(item[1]) if index is None else index
        super().__init__(message)
        self.path = path
        self.index = index

    def __str__(self) -> str:
        # The item's index in the text too: torch rebuilds a worker's exception from its text alone.
        text = super().__str__()
        if self.index is not None:
            text += f" (item {self.index})"
        return text if self.where is None else f"{text} (in {self.where})"

    def __reduce__(self) -> tuple:  # survives the trip from a worker process to the main process
        return (_rebuild_corrupt, (super().__str__(), self.path, self.index))


# torch's DataLoader re-raises a worker's exception as ``type(text)``, the text being "Caught X in DataLoader worker
# process N" plus the worker's whole traceback: the file's path appears three times, the message is lost in it, and
# ``path``/``index`` are gone. The constructor recognises that text and keeps the last message, naming the worker.
_TORCH_WORKER_PREFIX = "Caught CorruptItemError in DataLoader worker process"
_TORCH_LAST_LINE = "CorruptItemError: "
_ITEM_SUFFIX = re.compile(r" \(item (\d+)\)$")


def _from_torch_worker(text: str) -> tuple[str, str | None, int | None, str, str]:
    """(message, path if recognisable, item index if given, where, traceback) from torch's re-raised text."""
    where = text.split("\n", 1)[0].removeprefix("Caught CorruptItemError in ").rstrip(".")
    cut = text.rfind(_TORCH_LAST_LINE)
    if cut < 0:
        return text, None, None, where, text
    original = text[cut + len(_TORCH_LAST_LINE) :].strip()
    index = None
    item = _ITEM_SUFFIX.search(original)
    if item is not None:
        original, index = original[: item.start()], int(item[1])
    head = original.split(": ", 1)[0]
    path = head if head != original and ("://" in head or os.path.exists(head)) else None
    return original, path, index, where, text


def _rebuild_corrupt(message: str, path: str | None, index: int | None) -> CorruptItemError:
    return CorruptItemError(message, path=path, index=index)


class WorkerDiedError(CoordlError):
    """A loader worker process died (killed, segfault, out of memory) while preparing an item."""


class CoordlTimeoutError(CoordlError, TimeoutError):
    """A wait (for a batch, a peer, a job of the group) ran past its timeout."""

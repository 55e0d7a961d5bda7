"""Items whose fetch or prep raised :class:`CorruptItemError`: raised, or with ``on_error="skip"`` dropped
from their batch and logged once.

Once means once per item for the whole loader: the flags live in shared memory, one byte per item,
so a bad file is not logged again by every worker or every epoch (non-persistent workers are new
processes every epoch).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from coordl.datasets.source import describe_item
from coordl.errors import CorruptItemError
from shmem.segment import Segment

__all__ = ["SKIPPED", "SkipLog"]

log = logging.getLogger("coordl")

SKIPPED = object()
"""What a dropped item gives in place of its sample."""


class SkipLog:
    """What happens to a corrupt item of ``source``: ``on_error`` is ``"raise"`` or ``"skip"``.

    ``segment`` holds the shared "already logged" flags (None unless ``on_error="skip"``).
    """

    def __init__(self, source: Any, on_error: str) -> None:
        self.source = source
        self.on_error = on_error
        self.segment = Segment.create("skiplog", len(source)) if on_error == "skip" else None
        if self.segment is not None:
            self.segment.reserve(0, self.segment.size)

    def skip_or_raise(self, error: CorruptItemError, index: int) -> Any:
        """:data:`SKIPPED` (logging the item the first time) or, without ``on_error="skip"``, ``error``
        raised; either way naming the item and its file."""
        if error.index is None:
            error.index = index
        if error.path is None:
            what = describe_item(self.source, index)
            if what != f"item {index}":
                error.path = what
        if self.on_error != "skip":
            raise error
        assert self.segment is not None  # made in __init__ whenever on_error is "skip"
        logged = self.segment.array(np.uint8, 0, len(self.source))
        if not logged[index]:
            logged[index] = 1
            log.warning("coordl: skipping %s: %s", error.path or f"item {index}", error)
        return SKIPPED

    def close(self) -> None:
        if self.segment is not None:
            self.segment.close()

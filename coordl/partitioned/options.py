"""``partitioned=`` of ``coordl.DataLoader``: True, or :class:`PartitionedOptions` for the settings a job sets.

``coordl.DataLoader(..., partitioned=coordl.PartitionedOptions(tls=True))`` asks for the partitioned
cache with its nodes' Redis over TLS (:mod:`coordl.partitioned.peer_tls`); ``partitioned=True`` keeps
the defaults, which the environment sets (``COORDL_PEER_TLS``).

The loader hands ``partitioned=`` as given to its fetch chain (:class:`coordl.fetch.chain.FetchChain`),
which passes the settings (:func:`as_options`) to :func:`coordl.partitioned.tier.build_partitioned_tier`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from memcache.tls import TLS

__all__ = ["PartitionedOptions", "check_partitioned", "as_options", "PUSH_WAIT_S"]

PUSH_WAIT_S = 30.0  # at an epoch's end, the longest wait for items still on their way to their owners


@dataclass(frozen=True)
class PartitionedOptions:
    """The partitioned cache (as ``partitioned=True``), with its settings.

    Args:
        tls: the nodes' Redis over TLS only, client certificates required. True: certificates of a CA
            every rank derives from the job's secret (on more than one node, ``COORDL_PEER_SECRET`` must
            then be set, the same on every rank), or your ``MEMCACHE_TLS_CA``/``_CERT``/``_KEY`` files
            when set; a :class:`memcache.TLS`: those files; False: plain text; None (default):
            ``COORDL_PEER_TLS`` (or what a ``rediss://`` ``COORDL_PEER_REDIS`` says).
        push_wait_s: at the end of each epoch the loader waits until the items this rank read from
            storage have reached their owners' caches (sent in the background while the epoch ran), so
            that no node reads them from storage again; this long at most (then it logs a warning and
            goes on: those items are read from storage once more). 0: no wait.
    """

    tls: TLS | bool | None = None
    push_wait_s: float = PUSH_WAIT_S

    def __post_init__(self) -> None:
        if self.tls is not None and not isinstance(self.tls, (bool, TLS)):
            raise TypeError(
                "PartitionedOptions(tls=) must be True, False, None or a memcache.TLS(ca=, cert=, key=), "
                f"got {type(self.tls).__name__}"
            )
        wait = self.push_wait_s
        if (
            isinstance(wait, bool)
            or not isinstance(wait, (int, float))
            or not math.isfinite(wait)
            or wait < 0
        ):
            raise ValueError(
                f"PartitionedOptions(push_wait_s=) must be a number of seconds >= 0, got {wait!r}"
            )


def check_partitioned(value: Any) -> None:
    """Refuse a ``partitioned=`` that is neither a bool nor a :class:`PartitionedOptions`, naming it."""
    if not isinstance(value, (bool, PartitionedOptions)):
        raise TypeError(
            "partitioned must be True, False or a coordl.PartitionedOptions(tls=...), "
            f"got {type(value).__name__}"
        )


def as_options(partitioned: bool | PartitionedOptions) -> PartitionedOptions | None:
    """The settings ``partitioned=`` asks for: None for False, the defaults for True (checked first)."""
    check_partitioned(partitioned)
    if isinstance(partitioned, PartitionedOptions):
        return partitioned
    return PartitionedOptions() if partitioned else None

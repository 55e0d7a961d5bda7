"""``partitioned=`` of ``coordl.DataLoader``: True, or :class:`PartitionedOptions` for the settings a job sets.

``coordl.DataLoader(..., partitioned=coordl.PartitionedOptions(tls=True))`` asks for the partitioned
cache with its nodes' Redis over TLS (:mod:`coordl.partitioned.peer_tls`); ``partitioned=True`` keeps
the defaults, which the environment sets (``COORDL_PEER_TLS``).

The loader's fetch chain (:class:`coordl.fetch.chain.FetchChain`) builds the tier with the chain's own
arguments; what ``partitioned=`` asked for reaches :func:`coordl.partitioned.tier.build_partitioned_tier`
through :func:`building`, which the loader wraps around the chain's construction (a context variable:
set for that call only, in that thread).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from memcache.tls import TLS

__all__ = ["PartitionedOptions", "check_partitioned", "building", "asked_tls"]


@dataclass(frozen=True)
class PartitionedOptions:
    """The partitioned cache (as ``partitioned=True``), with its settings.

    Args:
        tls: the nodes' Redis over TLS only, client certificates required. True: certificates of a CA
            every rank derives from the job's secret (on more than one node, ``COORDL_PEER_SECRET`` must
            then be set, the same on every rank), or your ``MEMCACHE_TLS_CA``/``_CERT``/``_KEY`` files
            when set; a :class:`memcache.TLS`: those files; False: plain text; None (default):
            ``COORDL_PEER_TLS`` (or what a ``rediss://`` ``COORDL_PEER_REDIS`` says).
    """

    tls: TLS | bool | None = None

    def __post_init__(self) -> None:
        if self.tls is not None and not isinstance(self.tls, (bool, TLS)):
            raise TypeError(
                "PartitionedOptions(tls=) must be True, False, None or a memcache.TLS(ca=, cert=, key=), "
                f"got {type(self.tls).__name__}"
            )


def check_partitioned(value: Any) -> None:
    """Refuse a ``partitioned=`` that is neither a bool nor a :class:`PartitionedOptions`, naming it."""
    if not isinstance(value, (bool, PartitionedOptions)):
        raise TypeError(
            "partitioned must be True, False or a coordl.PartitionedOptions(tls=...), "
            f"got {type(value).__name__}"
        )


_ASKED_TLS: ContextVar[TLS | bool | None] = ContextVar("coordl_partitioned_tls", default=None)


@contextmanager
def building(partitioned: Any) -> Iterator[None]:
    """While a loader builds its fetch chain: the ``tls`` its ``partitioned=`` asked for (see the module)."""
    tls = partitioned.tls if isinstance(partitioned, PartitionedOptions) else None
    token = _ASKED_TLS.set(tls)
    try:
        yield
    finally:
        _ASKED_TLS.reset(token)


def asked_tls() -> TLS | bool | None:
    """The ``tls`` of the loader whose chain is being built (None: none asked, the environment decides)."""
    return _ASKED_TLS.get()

"""Consistent hashing with virtual nodes: which node of a cluster owns a key.

Each node is placed on a 64-bit ring at ``vnodes`` pseudo-random points (BLAKE2b of ``"<node>#<i>"``);
a key belongs to the first point clockwise from its own hash. With 160 points per node every node owns
close to 1/N of the keys, and adding or removing a node moves only about 1/N of them, so the samples the
other nodes already hold stay where they are.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Sequence

__all__ = ["HashRing"]


def _hash64(data: str) -> int:
    return int.from_bytes(hashlib.blake2b(data.encode(), digest_size=8).digest(), "little")


class HashRing:
    """Maps keys to nodes.

    Args:
        nodes: node names (for Redis, ``"host:port"``); order does not matter.
        vnodes: points per node on the ring; more points spread keys more evenly.
    """

    def __init__(self, nodes: Iterable[str], vnodes: int = 160) -> None:
        self.nodes: tuple[str, ...] = tuple(dict.fromkeys(nodes))
        if not self.nodes:
            raise ValueError("HashRing needs at least one node")
        points = sorted((_hash64(f"{node}#{i}"), node) for node in self.nodes for i in range(vnodes))
        self._hashes = [h for h, _ in points]
        self._owners = [n for _, n in points]

    def node_for(self, key: str) -> str:
        """The node that owns ``key``."""
        i = bisect.bisect(self._hashes, _hash64(key))
        return self._owners[i % len(self._owners)]

    def split(self, keys: Sequence[str]) -> dict[str, list[str]]:
        """Keys grouped by owning node (each group keeps the input order)."""
        groups: dict[str, list[str]] = {}
        for key in keys:
            groups.setdefault(self.node_for(key), []).append(key)
        return groups

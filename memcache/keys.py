"""Cache keys: dataset identity + deterministic-transform identity + sample index.

Both identities go into the key, so a changed dataset or a changed deterministic transform (another
resize, another decoder) never serves samples made the old way: they simply become misses. The two
identities are folded into a short digest so keys stay small on the wire (Redis MGET of thousands).
"""

from __future__ import annotations

import hashlib

__all__ = ["KeySpace", "sample_key"]

_PREFIX = "mc1"


class KeySpace:
    """Keys of one (dataset, deterministic prep) pair: ``mc1:<16 hex digest>:<index>``."""

    def __init__(self, dataset_identity: str, prep_identity: str) -> None:
        h = hashlib.blake2b(digest_size=8)
        for part in (dataset_identity, prep_identity):
            data = part.encode()
            h.update(len(data).to_bytes(8, "little"))  # length-prefixed: ("ab","c") != ("a","bc")
            h.update(data)
        self.prefix = f"{_PREFIX}:{h.hexdigest()}:"

    def key(self, index: int) -> str:
        return f"{self.prefix}{int(index)}"

    def keys(self, indices: list[int]) -> list[str]:
        p = self.prefix
        return [f"{p}{int(i)}" for i in indices]


def sample_key(dataset_identity: str, prep_identity: str, index: int) -> str:
    """The key of sample ``index`` (see :class:`KeySpace`)."""
    return KeySpace(dataset_identity, prep_identity).key(index)

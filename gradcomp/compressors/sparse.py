"""Sparsifiers: exact top-k, MSTopK and random-k. Payload = (values, int32/int64 indices), exactly k of each."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gradcomp.compressors.base import Compressor, Context
from gradcomp.mstopk import mstopk, topk

__all__ = ["Sparsifier", "TopK", "MSTopK", "RandomK", "k_for"]


def k_for(numel: int, ratio: float) -> int:
    """Entries kept for a tensor of ``numel`` at density ``ratio`` (at least 1 of a non-empty tensor)."""
    if not 0 < ratio <= 1:
        raise ValueError(f"ratio must be in (0, 1], got {ratio}")
    return min(numel, max(1, int(round(numel * ratio)))) if numel else 0


def _index_dtype(numel: int) -> torch.dtype:
    # int32 halves index traffic; only tensors beyond 2^31 elements need int64.
    return torch.int32 if numel < 2**31 else torch.int64


class Sparsifier(Compressor):
    """Keeps ``k_for(numel, ratio)`` entries: payload ``[values, indices]``; subclasses choose which (``select``).

    gTop-k and hierarchical top-k communicators accept any sparsifier, since they only need that payload.
    """

    biased = True

    def __init__(self, ratio: float) -> None:
        k_for(1, ratio)  # validates ratio
        self.ratio = ratio

    @classmethod
    def from_options(cls, ratio: float, options: Mapping[str, Any]) -> Sparsifier:
        return cls(ratio)

    def select(self, x: torch.Tensor, k: int, key: object) -> tuple[torch.Tensor, torch.Tensor]:
        """``(values, indices)`` of the ``k`` entries of flat ``x`` to send."""
        raise NotImplementedError

    def compress(self, x: torch.Tensor, key: object = None) -> tuple[list[torch.Tensor], Context]:
        flat = x.reshape(-1)
        values, idx = self.select(flat, k_for(flat.numel(), self.ratio), key)
        return [values, idx.to(_index_dtype(flat.numel()))], Context(flat.numel(), x.dtype, x.device)

    def decompress(self, payload: list[torch.Tensor], ctx: Context) -> torch.Tensor:
        values, idx = payload
        out = torch.zeros(ctx.numel, dtype=ctx.dtype, device=ctx.device)
        out[idx.long()] = values.to(ctx.dtype)
        return out

    def aggregate(self, payloads: list[list[torch.Tensor]], ctx: Context) -> torch.Tensor:
        out = torch.zeros(ctx.numel, dtype=ctx.dtype, device=ctx.device)
        values = torch.cat([p[0] for p in payloads]).to(ctx.dtype)
        idx = torch.cat([p[1] for p in payloads]).long()
        return out.index_add_(0, idx, values)

    def payload_bytes(self, numel: int) -> int:
        k = k_for(numel, self.ratio)
        return k * 4 + k * torch.empty(0, dtype=_index_dtype(numel)).element_size()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(ratio={self.ratio})"


class TopK(Sparsifier):
    """Exact top-k by magnitude (``torch.topk``)."""

    name = "topk"

    def select(self, x: torch.Tensor, k: int, key: object) -> tuple[torch.Tensor, torch.Tensor]:
        return topk(x, k)


class MSTopK(Sparsifier):
    """Sort-free approximate top-k (``gradcomp.mstopk``), exactly k entries."""

    name = "mstopk"

    def __init__(self, ratio: float, rounds: int = 20) -> None:
        super().__init__(ratio)
        self.rounds = rounds

    @classmethod
    def from_options(cls, ratio: float, options: Mapping[str, Any]) -> MSTopK:
        return cls(ratio, rounds=int(options.get("rounds", 20)))

    def select(self, x: torch.Tensor, k: int, key: object) -> tuple[torch.Tensor, torch.Tensor]:
        return mstopk(x, k, rounds=self.rounds)


class RandomK(Sparsifier):
    """k random coordinates, the same on every rank (seeded by ``seed``, key and call count).

    Because all ranks pick the same coordinates, only the values travel and they are summed by an all-reduce.
    """

    name = "randomk"
    summable = True

    def __init__(self, ratio: float, seed: int = 0) -> None:
        super().__init__(ratio)
        self.seed = seed
        self._calls: dict[object, int] = {}

    @classmethod
    def from_options(cls, ratio: float, options: Mapping[str, Any]) -> RandomK:
        return cls(ratio, seed=int(options.get("seed", 0)))

    def _indices(self, numel: int, k: int, key: object) -> torch.Tensor:
        n = self._calls.get(key, 0)
        self._calls[key] = n + 1
        # A stable per-key seed: hash() of str is salted per process, so derive it from the text's bytes.
        key_seed = int.from_bytes(repr(key).encode()[-8:].rjust(8, b"\0"), "little") & 0xFFFFFFFF
        gen = torch.Generator().manual_seed(
            (self.seed * 1_000_003 + key_seed * 7919 + n) & 0x7FFFFFFFFFFFFFFF
        )
        return torch.randperm(numel, generator=gen)[:k]

    def select(self, x: torch.Tensor, k: int, key: object) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self._indices(x.numel(), k, key).to(x.device)
        return x[idx], idx

    def compress(self, x: torch.Tensor, key: object = None) -> tuple[list[torch.Tensor], Context]:
        values, idx = super().compress(x, key)[0]
        # The indices are known to every rank; they ride in the payload list but are not summed (AllReduce).
        return [values, idx], Context(x.numel(), x.dtype, x.device)

    def payload_bytes(self, numel: int) -> int:
        return k_for(numel, self.ratio) * 4

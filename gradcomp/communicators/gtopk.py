"""gTop-k communicator: the global top-k of the summed sparse vectors by log2(P) pairwise merge rounds."""

from __future__ import annotations

import torch
import torch.distributed as dist

from gradcomp.collectives import gtopk
from gradcomp.communicators.base import Communicator, completed
from gradcomp.compressors import Compressor, Sparsifier, k_for
from gradcomp.memory import Memory

__all__ = ["GTopK"]


class GTopK(Communicator):
    """Each rank picks k entries with its sparsifier; ``collectives.gtopk`` merges them pairwise, keeping k.

    Runs its rounds inside ``sync`` (no overlap with the rest of backward). With error feedback, local picks that
    lost globally go back into the residual: they were not sent after all.
    """

    def __init__(
        self, compressor: Compressor, memory: Memory, group: dist.ProcessGroup | None = None
    ) -> None:
        if not isinstance(compressor, Sparsifier):
            raise TypeError(f"gTop-k needs a sparsifier's (values, indices) payload, got {compressor!r}")
        super().__init__(compressor, memory, group)
        self.sparsifier = compressor

    def sync(
        self, x: torch.Tensor, key: object, partitions: int = 1, shapes: list[torch.Size] | None = None
    ) -> torch.futures.Future:
        comp = self.memory.compensate(x, key)
        k = k_for(comp.numel(), self.sparsifier.ratio)
        val, idx = self.sparsifier.compress(comp, key)[0]
        idx = idx.long()
        g_idx, g_val = gtopk(idx, val, k, self.group)
        if self.memory.enabled:
            kept = torch.isin(idx, g_idx)
            sent = torch.zeros_like(comp)
            sent[idx[kept]] = val[kept]
            self.memory.update(comp, key, sent)
        out = torch.zeros_like(x)
        out[g_idx] = g_val
        return completed(out)

"""PowerSGD (Vogels et al., NeurIPS 2019): rank-r approximation of each gradient matrix, two all-reduces per step.

Each matrix M (a parameter's gradient viewed as rows x rest) is approximated as P Q^T: P = M Q is all-reduced and
orthogonalised, then Q = M^T P is all-reduced. Q is kept between steps (warm start), so one power iteration per
step suffices. Tensors that would not shrink by ``min_compression_rate`` (biases, small layers) travel dense in
the same all-reduce as P, which saves a start-up latency. The first ``start_iter`` steps are dense (warm-up), as
the method needs to converge. Error feedback keeps ``M - P Q_local^T`` per rank, so what ranks sent sums to
exactly the aggregate approximation.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gradcomp.memory import Memory, NoMemory, ResidualMemory

__all__ = ["PowerSGDReducer"]


class PowerSGDReducer:
    """Low-rank all-reduce of one flat buffer holding tensors of the given shapes."""

    def __init__(
        self,
        rank: int = 1,
        start_iter: int = 10,
        min_compression_rate: float = 2.0,
        error_feedback: bool = True,
        seed: int = 0,
        memory: Memory | None = None,
    ) -> None:
        """``memory`` overrides ``error_feedback`` (a communicator passes the memory it was built with)."""
        if rank < 1:
            raise ValueError(f"powersgd rank must be >= 1, got {rank}")
        self.rank = rank
        self.start_iter = start_iter
        self.min_compression_rate = min_compression_rate
        self.memory = memory if memory is not None else ResidualMemory() if error_feedback else NoMemory()
        self.seed = seed
        self._q: dict[object, torch.Tensor] = {}
        self._steps: dict[object, int] = {}

    def _compressible(self, shape: torch.Size) -> tuple[int, int, int] | None:
        if len(shape) < 2:
            return None
        n = shape[0]
        m = int(torch.Size(shape[1:]).numel())
        r = min(self.rank, n, m)
        if (n + m) * r * self.min_compression_rate >= n * m:
            return None
        return n, m, r

    def _initial_q(self, key: object, m: int, r: int, like: torch.Tensor) -> torch.Tensor:
        # Same seed on every rank, so the first P = M Q is consistent across ranks.
        gen = torch.Generator().manual_seed(self.seed + len(self._q))
        return torch.randn(m, r, generator=gen).to(device=like.device, dtype=like.dtype)

    def reduce(self, x: torch.Tensor, shapes: list[torch.Size], key: object, group=None) -> torch.Tensor:
        """Approximate sum over ranks of flat ``x`` (the concatenation of tensors of ``shapes``)."""
        step = self._steps.get(key, 0)
        self._steps[key] = step + 1
        if step < self.start_iter:
            dist.all_reduce(x, group=group)
            return x
        x = self.memory.compensate(x, key)
        mats, dense, offset = [], [], 0
        for i, shape in enumerate(shapes):
            n_el = int(torch.Size(shape).numel())
            piece = x[offset : offset + n_el]
            dims = self._compressible(torch.Size(shape))
            if dims is None:
                dense.append((offset, piece))
            else:
                n, m, r = dims
                qkey = (key, i)
                if qkey not in self._q:
                    self._q[qkey] = self._initial_q(qkey, m, r, x)
                mats.append((offset, piece.view(n, m), qkey))
            offset += n_el
        if offset != x.numel():
            raise ValueError(f"powersgd: shapes cover {offset} elements, buffer {key!r} has {x.numel()}")
        ps = [mat @ self._q[qk] for _, mat, qk in mats]
        first = torch.cat([p.reshape(-1) for p in ps] + [d for _, d in dense]) if (ps or dense) else x[:0]
        dist.all_reduce(first, group=group)
        out = torch.empty_like(x)
        pos = 0
        for i, p in enumerate(ps):
            ps[i] = torch.linalg.qr(first[pos : pos + p.numel()].view_as(p)).Q
            pos += p.numel()
        for off, d in dense:
            out[off : off + d.numel()] = first[pos : pos + d.numel()]
            pos += d.numel()
        qs_local = [mat.t() @ p for (_, mat, _), p in zip(mats, ps, strict=True)]
        if qs_local:
            second = torch.cat([q.reshape(-1) for q in qs_local])
            local_sent = torch.zeros_like(x)
            for (off, mat, _), p, q in zip(mats, ps, qs_local, strict=True):
                local_sent[off : off + mat.numel()] = (p @ q.t()).reshape(-1)
            for off, d in dense:
                local_sent[off : off + d.numel()] = d
            self.memory.update(x, key, local_sent)
            dist.all_reduce(second, group=group)
            pos = 0
            for (off, mat, qk), p, q in zip(mats, ps, qs_local, strict=True):
                q_sum = second[pos : pos + q.numel()].view_as(q)
                pos += q.numel()
                self._q[qk] = q_sum.clone()
                out[off : off + mat.numel()] = (p @ q_sum.t()).reshape(-1)
        else:
            self.memory.update(x, key, x)
        return out

"""Quantisers: none, fp16/bf16 cast, QSGD, TernGrad and sign (1 bit per entry with a mean-magnitude scale)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gradcomp.compressors.base import Compressor, Context

__all__ = ["NoCompression", "CastCompressor", "Fp16", "Bf16", "QSGD", "TernGrad", "SignSGD"]


def _ctx(x: torch.Tensor) -> Context:
    return Context(x.numel(), x.dtype, x.device)


class NoCompression(Compressor):
    """Plain all-reduce of the float32 gradient."""

    name = "none"
    summable = True

    def compress(self, x: torch.Tensor, key: object = None) -> tuple[list[torch.Tensor], Context]:
        return [x.reshape(-1)], _ctx(x)

    def decompress(self, payload: list[torch.Tensor], ctx: Context) -> torch.Tensor:
        return payload[0]

    def payload_bytes(self, numel: int) -> int:
        return numel * 4


class CastCompressor(Compressor):
    """Cast to a 16-bit float for the wire (the hook divides by the world size first, so sums cannot overflow)."""

    summable = True

    def __init__(self, dtype: torch.dtype = torch.float16) -> None:
        self.wire_dtype = dtype
        self.name = "fp16" if dtype == torch.float16 else "bf16"

    def compress(self, x: torch.Tensor, key: object = None) -> tuple[list[torch.Tensor], Context]:
        return [x.reshape(-1).to(self.wire_dtype)], _ctx(x)

    def decompress(self, payload: list[torch.Tensor], ctx: Context) -> torch.Tensor:
        return payload[0].to(ctx.dtype)

    def payload_bytes(self, numel: int) -> int:
        return numel * 2


class Fp16(CastCompressor):
    """IEEE half precision on the wire: 10 mantissa bits, range up to 65504."""

    def __init__(self) -> None:
        super().__init__(torch.float16)


class Bf16(CastCompressor):
    """bfloat16 on the wire: float32's range, 7 mantissa bits."""

    def __init__(self) -> None:
        super().__init__(torch.bfloat16)


class QSGD(Compressor):
    """QSGD (Alistarh et al.): ``norm * sign * l / s`` with l stochastically rounded; unbiased."""

    name = "qsgd"

    def __init__(self, levels: int = 127) -> None:
        if levels < 1:
            raise ValueError(f"qsgd levels must be >= 1, got {levels}")
        self.levels = levels
        self.wire_dtype = torch.int8 if levels <= 127 else torch.int16 if levels <= 32767 else torch.int32

    @classmethod
    def from_options(cls, ratio: float, options: Mapping[str, Any]) -> QSGD:
        return cls(levels=int(options.get("levels", 127)))

    def compress(self, x: torch.Tensor, key: object = None) -> tuple[list[torch.Tensor], Context]:
        flat = x.reshape(-1).float()
        norm = flat.norm()
        scaled = flat.abs() / norm.clamp_min(torch.finfo(torch.float32).tiny) * self.levels
        low = scaled.floor()
        level = low + (torch.rand_like(scaled) < (scaled - low)).float()
        q = (torch.sign(flat) * level).to(self.wire_dtype)
        return [norm.reshape(1), q], _ctx(x)

    def decompress(self, payload: list[torch.Tensor], ctx: Context) -> torch.Tensor:
        norm, q = payload
        return (q.float() * (norm / self.levels)).to(ctx.dtype)

    def payload_bytes(self, numel: int) -> int:
        return 4 + numel * torch.empty(0, dtype=self.wire_dtype).element_size()

    def __repr__(self) -> str:
        return f"QSGD(levels={self.levels})"


class TernGrad(Compressor):
    """TernGrad (Wen et al.): ``max|x| * sign * b`` with ``b ~ Bernoulli(|x| / max|x|)``; unbiased, 1 byte/entry."""

    name = "terngrad"

    def compress(self, x: torch.Tensor, key: object = None) -> tuple[list[torch.Tensor], Context]:
        flat = x.reshape(-1).float()
        scale = flat.abs().max() if flat.numel() else torch.zeros((), device=x.device)
        prob = flat.abs() / scale.clamp_min(torch.finfo(torch.float32).tiny)
        tern = (torch.sign(flat) * (torch.rand_like(prob) < prob).float()).to(torch.int8)
        return [scale.reshape(1), tern], _ctx(x)

    def decompress(self, payload: list[torch.Tensor], ctx: Context) -> torch.Tensor:
        scale, tern = payload
        return (tern.float() * scale).to(ctx.dtype)

    def payload_bytes(self, numel: int) -> int:
        return 4 + numel


_BIT_WEIGHTS = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)


class SignSGD(Compressor):
    """1-bit sign with a scale (mean |x|), packed 8 signs per byte; biased, so use it with error feedback."""

    name = "signsgd"
    biased = True

    def compress(self, x: torch.Tensor, key: object = None) -> tuple[list[torch.Tensor], Context]:
        flat = x.reshape(-1).float()
        scale = flat.abs().mean() if flat.numel() else torch.zeros((), device=x.device)
        bits = (flat >= 0).to(torch.uint8)
        pad = (-bits.numel()) % 8
        if pad:
            bits = torch.cat([bits, bits.new_zeros(pad)])
        packed = (bits.view(-1, 8) * _BIT_WEIGHTS.to(x.device)).sum(1, dtype=torch.uint8)
        return [scale.reshape(1), packed], _ctx(x)

    def decompress(self, payload: list[torch.Tensor], ctx: Context) -> torch.Tensor:
        scale, packed = payload
        bits = (packed.unsqueeze(1) & _BIT_WEIGHTS.to(packed.device)) > 0
        signs = bits.reshape(-1)[: ctx.numel].float() * 2 - 1
        return (signs * scale).to(ctx.dtype)

    def payload_bytes(self, numel: int) -> int:
        return 4 + (numel + 7) // 8

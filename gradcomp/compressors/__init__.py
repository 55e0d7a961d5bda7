"""Compressor registry: ``get_compressor(name, ratio)`` builds one of the methods by name."""

from __future__ import annotations

import torch

from gradcomp.compressors.base import Compressor, Context
from gradcomp.compressors.quantize import QSGD, CastCompressor, NoCompression, SignSGD, TernGrad
from gradcomp.compressors.sparse import MSTopK, RandomK, TopK, k_for

__all__ = [
    "Compressor",
    "Context",
    "NoCompression",
    "CastCompressor",
    "QSGD",
    "TernGrad",
    "SignSGD",
    "TopK",
    "MSTopK",
    "RandomK",
    "k_for",
    "get_compressor",
    "NAMES",
]

#: Names accepted by ``gradcomp.register``. ``gtopk`` and ``hitopk`` are top-k with their own collectives;
#: ``powersgd`` is a low-rank reducer with two all-reduces (``gradcomp.powersgd``).
NAMES = (
    "none",
    "fp16",
    "bf16",
    "topk",
    "mstopk",
    "randomk",
    "qsgd",
    "terngrad",
    "signsgd",
    "powersgd",
    "gtopk",
    "hitopk",
)


def get_compressor(name: str, ratio: float = 0.01, **options: object) -> Compressor:
    """The element-wise compressor for ``name`` (``powersgd``'s low-rank reducer is built by ``register``;
    its element-wise part is no compression)."""
    if name in ("none", "powersgd"):
        return NoCompression()
    if name == "fp16":
        return CastCompressor(torch.float16)
    if name == "bf16":
        return CastCompressor(torch.bfloat16)
    if name in ("topk", "gtopk", "hitopk"):
        return TopK(ratio)
    if name == "mstopk":
        return MSTopK(ratio, rounds=int(options.get("rounds", 20)))
    if name == "randomk":
        return RandomK(ratio, seed=int(options.get("seed", 0)))
    if name == "qsgd":
        return QSGD(levels=int(options.get("levels", 127)))
    if name == "terngrad":
        return TernGrad()
    if name == "signsgd":
        return SignSGD()
    raise ValueError(f"unknown compressor {name!r}; choose one of {', '.join(NAMES)}")

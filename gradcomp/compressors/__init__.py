"""Compressors (GRACE's compressor role): one class per encoding, behind ``base.Compressor``.

The public method names users pass to ``gradcomp.register`` (``"mstopk"``, ``"gtopk"`` ...) pair a compressor
with a communicator; that table is ``gradcomp.methods.METHODS``.
"""

from __future__ import annotations

from gradcomp.compressors.base import Compressor, Context
from gradcomp.compressors.quantize import QSGD, Bf16, CastCompressor, Fp16, NoCompression, SignSGD, TernGrad
from gradcomp.compressors.sparse import MSTopK, RandomK, Sparsifier, TopK, k_for

__all__ = [
    "Compressor",
    "Context",
    "NoCompression",
    "CastCompressor",
    "Fp16",
    "Bf16",
    "QSGD",
    "TernGrad",
    "SignSGD",
    "Sparsifier",
    "TopK",
    "MSTopK",
    "RandomK",
    "k_for",
]

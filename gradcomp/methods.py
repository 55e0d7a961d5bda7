"""The public method names and what each is built from: one compressor class and one communicator class.

``gradcomp.register(model, compressor="mstopk", ...)`` looks the name up in ``METHODS`` once and builds the
objects; nothing after that looks at the name again. Adding a method is one new class (a ``Compressor`` or a
``Communicator`` subclass) and one line in ``METHODS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from gradcomp.communicators import (
    AllGather,
    AllReduce,
    Communicator,
    DenseAllReduce,
    GTopK,
    HierarchicalTopK,
    LowRankAllReduce,
)
from gradcomp.compressors import (
    QSGD,
    Bf16,
    Compressor,
    Fp16,
    MSTopK,
    NoCompression,
    RandomK,
    SignSGD,
    TernGrad,
    TopK,
)
from gradcomp.memory import NoMemory, ResidualMemory

__all__ = ["Method", "METHODS", "NAMES", "method", "get_compressor", "build_communicator"]


@dataclass(frozen=True)
class Method:
    """A public method: the compressor that encodes each bucket and the communicator that moves it."""

    compressor: type[Compressor]
    communicator: type[Communicator]


METHODS: dict[str, Method] = {
    "none": Method(NoCompression, DenseAllReduce),
    "fp16": Method(Fp16, AllReduce),
    "bf16": Method(Bf16, AllReduce),
    "topk": Method(TopK, AllGather),
    "mstopk": Method(MSTopK, AllGather),
    "randomk": Method(RandomK, AllReduce),
    "qsgd": Method(QSGD, AllGather),
    "terngrad": Method(TernGrad, AllGather),
    "signsgd": Method(SignSGD, AllGather),
    "powersgd": Method(NoCompression, LowRankAllReduce),
    "gtopk": Method(TopK, GTopK),
    "hitopk": Method(TopK, HierarchicalTopK),
}

#: Names accepted by ``gradcomp.register`` and ``gradcomp train --compressor``.
NAMES = tuple(METHODS)


def method(name: str) -> Method:
    """The method called ``name``; a ValueError listing the choices for an unknown one."""
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown compressor {name!r}; choose one of {', '.join(NAMES)}") from None


def get_compressor(name: str, ratio: float = 0.01, **options: Any) -> Compressor:
    """The element-wise compressor of method ``name`` (for ``powersgd``, whose low-rank step is its
    communicator, that is no compression). Options: ``rounds`` (MSTopK), ``levels`` (QSGD), ``seed`` (random-k)."""
    return method(name).compressor.from_options(ratio, options)


def build_communicator(
    name: str,
    ratio: float = 0.01,
    error_feedback: bool = True,
    group: dist.ProcessGroup | None = None,
    options: Mapping[str, Any] | None = None,
) -> Communicator:
    """Compressor, memory and communicator of method ``name``, wired together (collective: every rank calls it,
    since hierarchical top-k creates its process groups here)."""
    spec = method(name)
    options = options or {}
    compressor = spec.compressor.from_options(ratio, options)
    memory = ResidualMemory() if error_feedback else NoMemory()
    return spec.communicator.from_options(compressor, memory, group, options)

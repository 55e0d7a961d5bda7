"""Communicators (GRACE's communicator role): how a compressed bucket travels, one class per scheme.

``DenseAllReduce`` (no compression), ``AllReduce`` (summable payloads), ``AllGather`` (any compressor, optional
pipelined partitions), ``GTopK`` (pairwise global top-k), ``HierarchicalTopK`` (dense in the node, sparse across
nodes) and ``LowRankAllReduce`` (PowerSGD). The interface is ``base.Communicator``.
"""

from __future__ import annotations

from gradcomp.communicators.allgather import AllGather
from gradcomp.communicators.allreduce import AllReduce, DenseAllReduce
from gradcomp.communicators.base import Communicator, completed
from gradcomp.communicators.gtopk import GTopK
from gradcomp.communicators.hierarchical import HierarchicalTopK
from gradcomp.communicators.lowrank import LowRankAllReduce

__all__ = [
    "Communicator",
    "completed",
    "DenseAllReduce",
    "AllReduce",
    "AllGather",
    "GTopK",
    "HierarchicalTopK",
    "LowRankAllReduce",
]

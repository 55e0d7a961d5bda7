"""Who owns which item of a partitioned cache, and which items each rank reads.

Kept apart from the fetch tier (:mod:`coordl.partitioned.tier`) because these depend only on a shared
seed, the nodes' cache budgets and torchrun's environment: no sockets, no shared memory, no torch. Every
rank computes the same answers without talking.

:class:`OwnerMap` cuts a seeded permutation of the items into ranges weighted by each node's cache budget.
:class:`PartitionedSampler` gives each rank a fresh random shard every epoch, with the same number of
samples on every rank (unequal batch counts hang DDP). :class:`NodeTopology` says where this process sits
in the job (rank, node, node leader).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["OwnerMap", "PartitionedSampler", "NodeTopology"]


class OwnerMap:
    """Which node's cache owns each item: a seeded permutation cut into ranges weighted by cache budget.

    Args:
        num_items: items of the dataset.
        weights: one non-negative weight per node (its cache budget in bytes); equal when None.
        num_nodes: the number of nodes when ``weights`` is None.
        seed: shared by all nodes, so every node computes the same map without talking.
    """

    def __init__(
        self,
        num_items: int,
        weights: Sequence[float] | None = None,
        *,
        num_nodes: int | None = None,
        seed: int = 0,
    ) -> None:
        if weights is None:
            if not num_nodes or num_nodes < 1:
                raise ValueError("OwnerMap needs weights or num_nodes >= 1")
            weights = [1.0] * num_nodes
        w = np.asarray(weights, dtype=np.float64)
        if w.ndim != 1 or len(w) == 0 or (w < 0).any() or w.sum() <= 0:
            raise ValueError(f"weights must be non-negative with a positive sum, got {list(weights)}")
        self.num_items = int(num_items)
        self.num_nodes = len(w)
        self.seed = seed
        cuts = np.rint(np.cumsum(w) / w.sum() * self.num_items).astype(np.int64)
        order = np.random.default_rng([seed, 0x0C0DE]).permutation(self.num_items)
        self._owner = np.empty(self.num_items, dtype=np.int32)
        # Each node owns one range of the permutation: its count is the range's length (stats() asks it
        # often; counting the map again cost a pass over every item, 2 ms per call at 10^6 items).
        self._counts = np.diff(cuts, prepend=0).tolist()
        start = 0
        for node, stop in enumerate(cuts):
            self._owner[order[start:stop]] = node
            start = stop

    def owner(self, index: int) -> int:
        return int(self._owner[index])

    def owned(self, node: int) -> np.ndarray:
        """Sorted indices node ``node`` owns."""
        return np.flatnonzero(self._owner == node)

    def counts(self) -> list[int]:
        """Items each node owns."""
        return list(self._counts)


class PartitionedSampler:
    """Like ``torch.utils.data.DistributedSampler``: a fresh random shard per epoch, equal sizes.

    Every rank draws the same permutation from ``(seed, epoch)``, pads it by repeating items (or drops
    the tail with ``drop_last``) to a multiple of ``num_replicas``, and takes every
    ``num_replicas``-th item from ``rank``. Call :meth:`set_epoch` before each epoch.
    """

    def __init__(
        self,
        num_items: int,
        num_replicas: int,
        rank: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is outside 0..{num_replicas - 1}")
        self.num_items = int(num_items)
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self._epoch_set = False
        if drop_last:
            self.num_samples = self.num_items // num_replicas
        else:
            self.num_samples = math.ceil(self.num_items / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order for the next pass. Without calls, each pass advances the epoch by one."""
        self.epoch = int(epoch)
        self._epoch_set = True

    def indices(self) -> np.ndarray:
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(self.num_items)
        else:
            order = np.arange(self.num_items)
        if self.total_size > len(order) and len(order):
            order = np.resize(order, self.total_size)  # repeats from the start, as torch pads
        order = order[: self.total_size]
        return order[self.rank : self.total_size : self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        if not self._epoch_set and getattr(self, "_iterated", False):
            # Forgetting set_epoch would repeat one order every epoch (a DistributedSampler pitfall).
            self.epoch += 1
        self._iterated = True
        self._epoch_set = False
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return self.num_samples


@dataclass(frozen=True)
class NodeTopology:
    """Where this process sits in a torchrun job: rank, local rank, node index and counts."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node: int
    num_nodes: int

    @property
    def is_node_leader(self) -> bool:
        """Local rank 0 holds the node's cache and runs its server; the node's other ranks use them."""
        return self.local_rank == 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> NodeTopology:
        """Read ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE``/``GROUP_RANK`` (torchrun)."""
        env = os.environ if env is None else env
        rank = int(env.get("RANK", 0))
        world = int(env.get("WORLD_SIZE", 1))
        # Without torchrun's LOCAL_* variables (e.g. mp.spawn on one machine) all ranks share one node.
        local_world = int(env.get("LOCAL_WORLD_SIZE", world if "LOCAL_RANK" not in env else 1))
        local_rank = int(env.get("LOCAL_RANK", rank % local_world))
        if world % local_world:
            raise ValueError(
                f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local_world}: the partitioned "
                "cache needs the same number of ranks on every node"
            )
        node = int(env.get("GROUP_RANK", rank // local_world))
        return cls(rank, world, local_rank, local_world, node, world // local_world)

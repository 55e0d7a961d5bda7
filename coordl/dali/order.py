"""A ``DALILoader``'s batch order: torch's own sampler machinery, drawn in the loader's process.

The same arguments as ``coordl.DataLoader`` (shuffle, generator, sampler, drop_last; a
``PartitionedSampler`` when ``partitioned=True`` and no sampler is given) go to a
``torch.utils.data.DataLoader`` over item indices, so both loaders yield the same batches for the
same seed. DALI needs a whole epoch's plan before it starts fetching, so :meth:`BatchOrder.draw` draws
the epoch at its start; torch draws lazily, and :meth:`BatchOrder.replay` makes up for the difference
when an epoch is left early.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils.data

from coordl.partitioned.ownership import NodeTopology, PartitionedSampler

__all__ = ["BatchOrder"]


class BatchOrder:
    """Each epoch's batches of item indices (lists of ints) over ``n`` items.

    ``sampler`` and ``shuffle`` are kept as the loader resolved them (the partitioned default applied),
    for a coordinated group that draws the order itself.
    """

    def __init__(
        self,
        n: int,
        batch_size: int,
        shuffle: bool | None,
        sampler: Any,
        drop_last: bool,
        generator: torch.Generator | None,
        partitioned: bool,
    ) -> None:
        if partitioned and sampler is None:
            topo = NodeTopology.from_env()  # a fresh random shard per rank and epoch, as coordl.DataLoader
            sampler = PartitionedSampler(n, topo.world_size, topo.rank, shuffle=bool(shuffle))
            shuffle = None
        self.sampler, self.shuffle = sampler, shuffle
        # A range is a map-style dataset to torch (len and indexing); its stubs want a Dataset.
        self.loader: torch.utils.data.DataLoader[Any] = torch.utils.data.DataLoader(
            range(n), batch_size=batch_size, shuffle=shuffle, sampler=sampler,  # type: ignore[arg-type]
            drop_last=drop_last, generator=generator, collate_fn=list,
        )  # fmt: skip
        self._generator_state: torch.Tensor | None = None  # the generator before this epoch's draws

    def __len__(self) -> int:
        return len(self.loader)

    def draw(self) -> list[list[int]]:
        """The next epoch's batches, all drawn now (the generator's state before them is kept)."""
        generator = self.loader.generator
        self._generator_state = generator.get_state() if generator is not None else None
        return list(self.loader)

    def replay(self, consumed: int) -> None:
        """Leave ``generator`` where a torch DataLoader that yielded ``consumed`` batches would have left it.

        The plan draws a whole epoch at its start; torch draws lazily, and a sampler stops drawing when
        the epoch is left early (``RandomSampler`` draws once more at its end). So after an early exit
        the generator is rewound and torch's iterator replayed for the batches the user received:
        the next epochs then equal those of a ``coordl.DataLoader(num_workers=0)`` left at the same batch.
        """
        generator = self.loader.generator
        if generator is None or self._generator_state is None:
            return
        generator.set_state(self._generator_state)
        replay = iter(self.loader)
        for _ in range(consumed):
            next(replay)
        del replay

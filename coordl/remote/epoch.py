"""One epoch shared between torch's local workers and the remote actors, in the sampler's order.

torch's iterator draws each batch of indices from its sampler iterator when it has room for one (at its
start, then one per batch it hands out). :class:`MergedEpoch` puts itself in that place: the sampler's
batches are numbered as they are drawn, by torch for its workers or by this class for an actor with
room (an actor gets a new batch when it finishes one: demand-driven, so a slow node gets fewer). The
trainer gets batch 0, 1, 2, ... in that numbering: a local one is torch's next batch (torch hands out
its own in the order it drew them), a remote one is its actor's result. So the order, the resumable
state (which counts batches handed out) and the per-item seeds (carried by the indices) are those of
the same loader without remote prep.

A batch whose actor died is prepped in the trainer when its turn comes; an item's error raised on an
actor is raised here as it was raised there.
"""

from __future__ import annotations

import collections
from typing import Any

from coordl.remote.actor import as_tensors

__all__ = ["MergedEpoch"]

LOCAL = "local"  # a batch torch drew for its workers

# Seconds per wait for an actor: between waits, finished actors get new batches.
_WAIT_S = 0.5


class Flight:
    """A batch sent to an actor: what it holds, and its result or error once it finished."""

    __slots__ = ("actor", "error", "finished", "indices", "lost", "raws", "ref", "result", "seeds")

    def __init__(self, actor: Any, ref: Any, indices: list[int], seeds: list[Any], raws: Any) -> None:
        self.actor, self.ref = actor, ref
        self.indices, self.seeds, self.raws = indices, seeds, raws
        self.result: Any = None
        self.error: BaseException | None = None  # the item's error raised on the actor
        self.finished = False
        self.lost = False  # its actor died: the batch is prepped in the trainer


class MergedEpoch:
    """torch's iterator for one epoch with remote actors added (see the module docstring).

    Args:
        torch_iter: torch's iterator of the epoch, just started.
        side: the loader's :class:`coordl.remote.dispatch.RemoteSide`.
    """

    def __init__(self, torch_iter: Any, side: Any) -> None:
        self.torch_iter = torch_iter
        self.side = side
        self.restart()

    def restart(self) -> None:
        """A new epoch on ``torch_iter`` (made or reset by torch): take over its sampler iterator."""
        it = self.torch_iter
        self.order = it._sampler_iter  # what torch has not drawn yet
        # batches torch drew at its start (prefetch) are the epoch's first, all local
        self.assigned: collections.deque = collections.deque([LOCAL] * int(getattr(it, "_send_idx", 0)))
        self.flights: dict[Any, Flight] = {}  # running on an actor, by Ray reference
        self.exhausted = False
        it._sampler_iter = _LocalShare(self)
        # the batches torch keeps drawn ahead for its workers (its prefetch; 0 without workers)
        self.local_window = int(getattr(it, "_prefetch_factor", 0) or 0) * int(
            getattr(it, "_num_workers", 0) or 0
        )
        self.pin = bool(getattr(it, "_pin_memory", False))
        self.pin_device = getattr(it, "_pin_memory_device", None)

    def __iter__(self) -> MergedEpoch:
        return self

    def __len__(self) -> int:
        return len(self.torch_iter)

    def __getattr__(self, name: str) -> Any:
        # torch's iterator's own names (``_workers``, ``_shutdown_workers``...), read by coordl's error
        # translation and by tools written for torch
        torch_iter = self.__dict__.get("torch_iter")
        if torch_iter is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(torch_iter, name)

    # -- drawing batches --------------------------------------------------------------------------------

    def draw(self) -> list[Any] | None:
        """The sampler's next batch, or None at the end of the epoch."""
        if self.exhausted:
            return None
        try:
            return next(self.order)
        except StopIteration:
            self.exhausted = True
            return None

    def draw_local(self) -> list[Any]:
        """torch drawing a batch for its workers."""
        batch = self.draw()
        if batch is None:
            raise StopIteration
        self.assigned.append(LOCAL)
        return batch

    def fill(self) -> None:
        """Note the actors' finished batches, then give each actor with room a new one.

        A batch counts as finished when its task ends, wherever its result is (``fetch_local=False``):
        waiting for it to be here as well would leave the actor idle behind the trainer's waits on its
        local workers (measured: 42% of the items remote, the remote core half idle; 50% and busy with).
        Batches are handed out in the sampler's order, so each side's share of an epoch follows its
        share of the batches drawn and not yet handed out: the actors may hold as many of those as
        torch's workers do (their prefetch), plus their own queues, so that the faster side is not held
        to the slower one's share.
        """
        side = self.side
        if self.flights:
            done, _ = side.ray.wait(
                list(self.flights), num_returns=len(self.flights), timeout=0, fetch_local=False
            )
            for ref in done:
                self._finish(self.flights.pop(ref))
        limit = 2 * side.prep.depth * len(side.live()) + self.local_window
        held = sum(1 for a in self.assigned if a is not LOCAL)
        for actor in side.live():
            while actor.alive and actor.pending < side.prep.depth and held < limit:
                batch = self.draw()
                if batch is None:
                    return
                self._send(actor, batch)
                held += 1

    def _send(self, actor: Any, batch: list[Any]) -> None:
        indices = [int(i) for i in batch]
        seeds = [getattr(i, "seed", None) for i in batch]
        raws = [self.side.fetch(i) for i in indices] if actor.ship else None
        ref = self.side.submit(actor, indices, seeds, raws)
        flight = Flight(actor, ref, indices, seeds, raws)
        self.flights[ref] = flight
        self.assigned.append(flight)

    def _finish(self, flight: Flight) -> None:
        """``flight``'s actor finished it: keep the result or the item's error; a lost actor is dropped."""
        side, errors = self.side, self.side.errors
        flight.finished = True
        flight.actor.pending -= 1
        try:
            result, read = side.ray.get(flight.ref)
            flight.result = as_tensors(result)
        except errors.RayTaskError as error:  # the item's own error, raised by prep on the actor
            flight.error = error.cause if isinstance(error.cause, BaseException) else error
            return
        except errors.RayError as error:  # the actor, its node or the cluster is gone
            flight.lost = True
            side.lose(flight.actor, error)
            return
        side.counts["remote_storage_bytes_read"] += read

    # -- handing out ------------------------------------------------------------------------------------

    def __next__(self) -> Any:
        self.fill()
        if self.assigned and self.assigned[0] is not LOCAL:
            return self._remote(self.assigned.popleft())
        if self.exhausted and not self.assigned:
            return next(self.torch_iter)  # torch ends its epoch (and stops its workers) as it would alone
        # torch's next batch: one it drew already, or (no workers, or every actor busy) one it draws now;
        # numbered handed out before torch runs, so that an item's error leaves the numbering right
        if self.assigned:
            self.assigned.popleft()
            return next(self.torch_iter)
        try:
            return next(self.torch_iter)
        finally:
            if self.assigned:
                self.assigned.popleft()

    def _remote(self, flight: Flight) -> Any:
        """``flight``'s batch; while it runs, finished actors get new batches."""
        side = self.side
        while not flight.finished:
            side.ray.wait([flight.ref], num_returns=1, timeout=_WAIT_S)
            self.fill()
        if flight.error is not None:
            error, flight.error = flight.error, None
            raise error
        if flight.lost:  # lost with its actor: prepped here, with the same seeds
            return self._pinned(side.redo(flight.indices, flight.seeds, flight.raws))
        result, flight.result = flight.result, None
        side.counts["remote_batches"] += 1
        side.counts["remote_items"] += len(flight.indices)
        return self._pinned(side.received(result))

    def _pinned(self, batch: Any) -> Any:
        """Pinned as torch's pin-memory thread pins local batches, when the loader pins."""
        if not self.pin:
            return batch
        from torch.utils.data._utils.pin_memory import pin_memory

        return pin_memory(batch, self.pin_device)


class _LocalShare:
    """torch's sampler iterator during a merged epoch: each batch torch draws is numbered local."""

    def __init__(self, merged: MergedEpoch) -> None:
        self.merged = merged

    def __iter__(self) -> _LocalShare:
        return self

    def __next__(self) -> list[Any]:
        return self.merged.draw_local()

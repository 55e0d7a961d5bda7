"""One epoch shared between torch's local workers and the remote actors, in the sampler's order.

torch's iterator draws each batch of indices from its sampler iterator when it has room for one (at its
start, then one per batch it hands out). :class:`MergedEpoch` puts itself in that place: the sampler's
batches are numbered as they are drawn, by torch for its workers or by this class for an actor with
room (an actor gets a new batch when it finishes one: demand-driven, so a slow node gets fewer). The
trainer gets batch 0, 1, 2, ... in that numbering: a local one is torch's next batch (torch hands out
its own in the order it drew them), a remote one is its actor's result. So the order, the resumable
state (which counts batches handed out) and the per-item seeds (carried by the indices) are those of
the same loader without remote prep.

torch's window of batches drawn ahead is its prefetch deepened by the actors' queues (``depth`` per
actor), and it is refilled at every batch handed out, local or remote; but toward the epoch's end torch
is not always given the batch it asks for: each batch a side holds is one the other cannot take once the
sampler is empty. torch gets it only while its queue, one longer, would still be done no later than the
actors' queues with every batch left (each side's rate: its share of the batches handed out so far); a
refused draw is asked again at the next batch, and torch always keeps at least one batch drawn. Before,
torch drew ``prefetch + 2 * depth * actors / workers`` batches per worker at the epoch's start and drained
them alone at its end: the remote core idled 29% of each 32-batch epoch (55% at ``depth=8``); now 12-16%
(2-core VM, 2026-11-28, 1,000 items: 1,134 samples/s against 1,035 at depth 2, 1,121 against 927 at
depth 8: benchmarks/bench_remote_prep.py --n 1000 --depth 8).

A batch whose actor died is prepped in the trainer when its turn comes; an item's error raised on an
actor is raised here as it was raised there.
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Any

from coordl.remote.actor import as_tensors
from coordl.resume.order import batch_seeds

__all__ = ["MergedEpoch", "torch_may_draw"]

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
        self.stop()
        it = self.torch_iter
        self.order = it._sampler_iter  # what torch has not drawn yet
        # batches torch drew at its start (prefetch) are the epoch's first, all local
        self.drawn = int(getattr(it, "_send_idx", 0))
        self.assigned: collections.deque = collections.deque([LOCAL] * self.drawn)
        self.flights: dict[Any, Flight] = {}  # running on an actor, by Ray reference
        self.exhausted = False
        it._sampler_iter = _LocalShare(self)
        # torch draws only as it hands out its own batches: its workers idled behind the actors' batches
        # (98% of the items went remote). Its window: deepened, refilled at every batch (the docstring)
        self.workers = int(getattr(it, "_num_workers", 0) or 0)
        factor = getattr(it, "_prefetch_factor", None)
        if self.workers > 0 and factor:
            ahead = self.side.prep.depth * len(self.side.live())
            it._prefetch_factor = factor = factor + -(-ahead // self.workers)
        self.local_window = int(factor or 0) * self.workers  # 0 without workers
        self.pin = bool(getattr(it, "_pin_memory", False))
        self.pin_device = getattr(it, "_pin_memory_device", None)
        # the draws, the queues and the actors' counts are shared with the feeder thread
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.stopped = False
        self.feeder = threading.Thread(target=self._feed, name="coordl-remote-feeder", daemon=True)
        self.feeder.start()

    def stop(self) -> None:
        """Stop this epoch's feeder thread (at the epoch's end, a restart, or the loader's close)."""
        feeder = self.__dict__.get("feeder")
        if feeder is None:
            return
        with self.changed:
            self.stopped = True
            self.changed.notify_all()
        if feeder is not threading.current_thread():
            feeder.join(timeout=5.0)

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
            batch = next(self.order)
        except StopIteration:
            self.exhausted = True
            return None
        self.drawn += 1
        return batch

    def draw_local(self) -> list[Any]:
        """torch drawing a batch for its workers (StopIteration: not now, see the module docstring)."""
        with self.lock:
            if not self._local_may_draw():
                raise StopIteration  # torch's _try_put_index puts nothing and asks again later
            batch = self.draw()
            if batch is None:
                raise StopIteration
            self.assigned.append(LOCAL)
            return batch

    def _local_may_draw(self) -> bool:
        """:func:`torch_may_draw` now (under the lock)."""
        try:
            left: int | None = len(self.torch_iter) - self.drawn
        except TypeError:  # a sampler without len()
            left = None
        queued = sum(1 for a in self.assigned if a is LOCAL)
        pending = [a.pending for a in self.side.live()]
        return torch_may_draw(queued, pending, left, self.side.handed, self.workers)

    def _top_up(self, shipping: bool) -> None:
        """Give each actor with room a new batch (under the lock); ``shipping``: also the actors that are
        sent raw bytes (read through the loader's tiers: only in the trainer's own thread).

        Batches are handed out in the sampler's order, so each side's share of an epoch follows its
        share of the batches drawn and not yet handed out: the actors may hold as many of those as
        torch's workers do (their prefetch), plus their own queues, so that the faster side is not held
        to the slower one's share.
        """
        side = self.side
        limit = 2 * side.prep.depth * len(side.live()) + self.local_window
        held = sum(1 for a in self.assigned if a is not LOCAL)
        for actor in side.live():
            if actor.ship and not shipping:
                continue
            while actor.alive and actor.pending < side.prep.depth and held < limit:
                batch = self.draw()
                if batch is None:
                    return
                self._send(actor, batch)
                held += 1

    def _feed(self) -> None:
        """The feeder thread: notes each batch an actor finishes as it finishes (``fetch_local=False``:
        wherever its result is), brings its result here, and gives the actor its next batch.

        Done in the trainer's main thread between batches, an actor that finished its queue while the
        trainer waited on a local worker sat idle until the next batch was handed out (measured: the
        remote core a third idle, 42-50% of the items remote where it could prep more than half).
        """
        ray = self.side.ray
        while True:
            with self.changed:
                if self.stopped:
                    return
                self._top_up(shipping=False)
                refs = list(self.flights)
                if not refs:
                    self.changed.wait(0.05)
                    continue
            lost: Exception | None = None
            try:
                done, _ = ray.wait(refs, num_returns=1, timeout=0.05, fetch_local=False)
            except Exception as error:  # the cluster is gone: every batch in flight is lost with it
                done, lost = refs, error
            # the transfer, outside the lock
            got = [(ref, ("lost", lost) if lost is not None else self._get(ref)) for ref in done]
            with self.changed:
                for ref, outcome in got:
                    flight = self.flights.pop(ref, None)
                    if flight is not None:
                        self._finish(flight, outcome)
                self.changed.notify_all()

    def _send(self, actor: Any, batch: list[Any]) -> None:
        indices = [int(i) for i in batch]
        seeds = batch_seeds(batch)  # the first index carries the epoch's seed (coordl.resume.order)
        raws = [self.side.fetch(i) for i in indices] if actor.ship else None
        ref = self.side.submit(actor, indices, seeds, raws)
        flight = Flight(actor, ref, indices, seeds, raws)
        self.flights[ref] = flight
        self.assigned.append(flight)

    def _get(self, ref: Any) -> tuple[str, Any]:
        """``("ok", (result, bytes read))``, ``("error", the item's error)`` or ``("lost", Ray's error)``."""
        errors = self.side.errors
        try:
            result, read = self.side.ray.get(ref)
            return "ok", (as_tensors(result), read)
        except errors.RayTaskError as error:  # the item's own error, raised by prep on the actor
            return "error", error.cause if isinstance(error.cause, BaseException) else error
        except errors.RayError as error:  # the actor, its node or the cluster is gone
            return "lost", error

    def _finish(self, flight: Flight, outcome: tuple[str, Any]) -> None:
        """``flight``'s actor finished it (under the lock): keep the result or the item's error; a lost
        actor is dropped."""
        flight.finished = True
        flight.actor.pending -= 1
        kind, value = outcome
        if kind == "error":
            flight.error = value
        elif kind == "lost":
            flight.lost = True
            self.side.lose(flight.actor, value)
        else:
            flight.result, read = value
            self.side.counts["remote_storage_bytes_read"] += read

    # -- handing out ------------------------------------------------------------------------------------

    def __next__(self) -> Any:
        if self.local_window and not self.exhausted:
            _fill(self.torch_iter, self.local_window)
        with self.lock:
            self._top_up(shipping=True)
            head = self.assigned.popleft() if self.assigned and self.assigned[0] is not LOCAL else None
            local_drawn = bool(self.assigned)
            if head is None and local_drawn:
                # torch's next batch, drawn already: numbered handed out before torch runs, so that an
                # item's error leaves the numbering right
                self.assigned.popleft()
            ending = head is None and self.exhausted and not local_drawn
        if head is not None:
            return self._remote(head)
        if ending:
            self.stop()
            return next(self.torch_iter)  # torch ends its epoch (and stops its workers) as it would alone
        self.side.handed[0] += 1
        if local_drawn:
            return next(self.torch_iter)
        # no workers, or every actor busy: torch draws its batch now
        try:
            return next(self.torch_iter)
        finally:
            with self.lock:
                if self.assigned and self.assigned[0] is LOCAL:
                    self.assigned.popleft()

    def _remote(self, flight: Flight) -> Any:
        """``flight``'s batch, once the feeder thread has it."""
        side = self.side
        with self.changed:
            while not flight.finished:
                if not self.feeder.is_alive():
                    raise RuntimeError("coordl remote prep: the feeder thread stopped during the epoch")
                self.changed.wait(_WAIT_S)
        if flight.error is not None:
            error, flight.error = flight.error, None
            raise error
        if flight.lost:  # lost with its actor: prepped here, with the same seeds
            return self._pinned(side.redo(flight.indices, flight.seeds, flight.raws))
        result, flight.result = flight.result, None
        side.handed[1] += 1
        side.counts["remote_batches"] += 1
        side.counts["remote_items"] += len(flight.indices)
        return self._pinned(side.received(result))

    def _pinned(self, batch: Any) -> Any:
        """Pinned as torch's pin-memory thread pins local batches, when the loader pins."""
        if not self.pin:
            return batch
        from torch.utils.data._utils.pin_memory import pin_memory

        return pin_memory(batch, self.pin_device)


def _fill(it: Any, window: int) -> None:
    """Let torch's iterator ``it`` draw for its workers up to ``window`` batches outstanding, while
    :func:`torch_may_draw` agrees (in the trainer's thread: torch's iterator is not thread-safe)."""
    while it._tasks_outstanding < window:
        sent = it._send_idx
        it._try_put_index()  # draws through _LocalShare: refused, exhausted or no live worker, draws nothing
        if it._send_idx == sent:
            return


def torch_may_draw(
    queued: int, pending: list[int], left: int | None, handed: list[int], workers: int
) -> bool:
    """Whether torch's workers, holding ``queued`` batches, take one more: always while they hold none,
    without actors (``pending``: each live actor's batches) or without a known end (``left`` None: the
    batches the sampler has left); else while their queue, one longer, ends no later than the actors'
    queues with every batch left would, each side's rate being the batches it ``handed`` out (local,
    remote) plus one per worker or actor to start."""
    if queued == 0 or not pending or left is None:
        return True
    local_rate = handed[0] + max(1, workers)
    remote_rate = handed[1] + len(pending)
    return (queued + 1) * remote_rate <= (sum(pending) + left) * local_rate


class _LocalShare:
    """torch's sampler iterator during a merged epoch: each batch torch draws is numbered local.

    It holds its epoch weakly: torch's iterator holds it, and a strong reference back would make a cycle
    that keeps each finished epoch's iterator, with its queues' pipes, open until a full garbage
    collection (the soak's remote-prep job: 4 pipes more per epoch, 1,200 descriptors in 4 minutes).
    """

    def __init__(self, merged: MergedEpoch) -> None:
        self.merged = weakref.ref(merged)

    def __iter__(self) -> _LocalShare:
        return self

    def __next__(self) -> list[Any]:
        merged = self.merged()
        if merged is None:  # the epoch is over and gone: nothing left to draw
            raise StopIteration
        return merged.draw_local()

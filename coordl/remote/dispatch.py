"""The loader's side of remote prep: its actors on the cluster, their faults, and ``stats()``.

:class:`RemoteSide` is made by the loader for ``remote_prep=``: it checks that the loader's options
allow it, connects, starts one :class:`coordl.remote.actor.PrepActor` per remote CPU (Ray places them;
the trainer's node joins with no CPUs), and for each epoch wraps torch's iterator in a
:class:`coordl.remote.epoch.MergedEpoch`, which shares the epoch's batches between torch's local
workers and the actors.

Faults: an actor whose node or process died is dropped, and each batch it held is prepped again in the
trainer (:func:`coordl.remote.actor.prep_batch`, the same seeds), so no batch is lost or handed out
twice; the loss is logged. When no actor is left (the cluster is gone), one ``RuntimeWarning`` says the
loader goes on with local prep only.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

from coordl.remote.actor import PrepActor, prep_batch, raw_digest
from coordl.remote.compact import collate_finished, compact_source, wire_bytes
from coordl.remote.connect import RemotePrep, RemotePrepError

__all__ = ["COUNTER_NAMES", "RemoteSide", "attach"]

log = logging.getLogger(__name__)

COUNTER_NAMES = (
    "remote_batches",  # batches prepped by an actor and handed out
    "remote_items",
    "remote_bytes_sent",  # raw bytes shipped to actors, plus 16 bytes per index (index and seed)
    "remote_bytes_received",  # bytes of the prepped batches' arrays that came back (uint8 crops: compact.py)
    "remote_storage_bytes_read",  # raw bytes the actors read from storage themselves
    "remote_redone_batches",  # batches an actor lost with its node, prepped again in the trainer
    "remote_redone_items",
)


class Actor:
    """One remote CPU: its Ray handle, where it runs, how it gets raw bytes, its batches in flight."""

    def __init__(self, handle: Any, number: int) -> None:
        self.handle = handle
        self.number = number
        self.host = "?"
        self.ship = False  # the trainer sends it the raw bytes
        self.pending = 0  # batches submitted and not yet finished
        self.alive = True

    def __repr__(self) -> str:
        return f"actor {self.number} on {self.host}"


class RemoteSide:
    """A loader's remote prep (see the module docstring).

    Args:
        prep: the user's :class:`RemotePrep`.
        source: the loader's item source (sent to every actor once).
        fetch: the trainer's read of an item through its tiers (bytes shipped, batches prepped again).
        collate_fn: the loader's collate (the user's, or torch's default).
    """

    def __init__(
        self, prep: RemotePrep, source: Any, fetch: Callable[[int], bytes], collate_fn: Callable
    ) -> None:
        self.prep = prep
        self.source = source
        self.fetch = fetch
        self.collate_fn = collate_fn
        self.counts = dict.fromkeys(COUNTER_NAMES, 0)
        self.actors: list[Actor] = []
        self.ready = False
        self.lost_warned = False
        self.closed = False
        self.handed = [0, 0]  # batches handed out from torch's workers and from actors: each side's rate
        self._merged: Any = None
        self.ray = prep.connect()
        self.errors = self.ray.exceptions
        cpus = prep.cpus or int(self.ray.cluster_resources().get("CPU", 0))
        if cpus < 1:
            raise RemotePrepError(
                f"remote_prep: the Ray cluster at {prep.address} offers no CPUs (start prep nodes with "
                "`ray start --address ... --num-cpus N`)"
            )
        # the standard recipe's float tail runs here, after the network (coordl.remote.compact)
        compact = compact_source(source)
        self.tail = None if compact is None else compact[1]
        try:
            source_ref = self.ray.put(source if compact is None else compact[0])
        except Exception as error:
            raise TypeError(
                f"remote_prep: the dataset {type(source).__name__} could not be sent to the Ray cluster "
                f"({type(error).__name__}: {error})"
            ) from error
        options: dict[str, Any] = {"num_cpus": 1, "max_restarts": 0, "scheduling_strategy": "SPREAD"}
        if prep.resources:
            options["resources"] = prep.resources
        actor_class = self.ray.remote(PrepActor).options(**options)
        actor_collate = collate_fn if compact is None else None
        self.actors = [Actor(actor_class.remote(source_ref, actor_collate), n) for n in range(cpus)]

    # -- the first epoch: actors up, read mode chosen ------------------------------------------------

    def start(self) -> None:
        """Wait for the actors (once) and choose, per actor, whether it reads items or is sent them."""
        if self.ready:
            return
        self.ready = True
        probes = {a.handle.probe.remote(0): a for a in self.actors}
        done, late = self.ray.wait(list(probes), num_returns=len(probes), timeout=self.prep.start_timeout)
        # the source's own read (not the loader's tiers: no cache fill, no counters)
        local = raw_digest(self.source.fetch(0)) if self.prep.read == "auto" else None
        for ref in late:
            self._drop(probes[ref], f"not started within {self.prep.start_timeout:.0f} s")
            self.ray.kill(probes[ref].handle)
        for ref in done:
            actor = probes[ref]
            try:
                answer = self.ray.get(ref)
            except self.errors.RayError as error:
                self._drop(actor, f"{type(error).__name__} at start")
                continue
            actor.host = answer["host"]
            actor.ship = self.prep.read == "ship" or (self.prep.read == "auto" and answer["digest"] != local)
            if self.prep.read == "auto":
                why = answer["why"] or ("a different read of item 0" if actor.ship else "")
                log.info(
                    "coordl remote prep: %r %s",
                    actor,
                    f"is sent raw bytes ({why})" if actor.ship else "reads",
                )
        self.check_alive()

    # -- each epoch -----------------------------------------------------------------------------------

    def wrap(self, start_workers: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``start_workers`` whose iterator shares its epoch with the actors."""
        from coordl.remote.epoch import MergedEpoch

        def start(torch_loader: Any) -> Any:
            if self.closed:
                return start_workers(torch_loader)
            self.start()
            # a persistent iterator keeps the window the last merged epoch gave it (MergedEpoch.restart):
            # its next start draws the user's prefetch only
            kept = getattr(torch_loader, "_iterator", None)
            if kept is not None and torch_loader.prefetch_factor is not None:
                kept._prefetch_factor = torch_loader.prefetch_factor
            torch_iter = start_workers(torch_loader)
            for actor in self.actors:  # batches of an epoch left early are forgotten (their results too)
                actor.pending = 0
            # the same wrapper while torch keeps its iterator (persistent workers): the batch ring
            # recognises the iterator it already knows
            if self._merged is None or self._merged.torch_iter is not torch_iter:
                self._merged = MergedEpoch(torch_iter, self)
            else:
                self._merged.restart()
            return self._merged

        return start

    def live(self) -> list[Actor]:
        return [a for a in self.actors if a.alive]

    def submit(
        self, actor: Actor, indices: list[int], seeds: list[int | None], raws: list[bytes] | None
    ) -> Any:
        """Send one batch to ``actor``; returns Ray's reference to its result."""
        actor.pending += 1
        self.counts["remote_bytes_sent"] += 16 * len(indices) + (sum(len(r) for r in raws) if raws else 0)
        return actor.handle.prep.remote(indices, seeds, raws)

    def received(self, result: Any) -> Any:
        """An actor's result as the batch the trainer hands out: compact samples finished and collated
        here; a collated batch as it came. Counts the bytes that came over the network."""
        self.counts["remote_bytes_received"] += wire_bytes(result)
        if self.tail is None:
            return result
        return collate_finished(result, self.tail, self.collate_fn)

    def redo(self, indices: list[int], seeds: list[int | None], raws: list[bytes] | None) -> Any:
        """A batch an actor lost, prepped in the trainer with the same seeds."""
        self.counts["remote_redone_batches"] += 1
        self.counts["remote_redone_items"] += len(indices)
        return prep_batch(self.source, indices, seeds, raws, self.fetch, self.collate_fn)[0]

    def lose(self, actor: Actor, error: BaseException) -> None:
        """``actor`` died (its node, its process, or the cluster): drop it, and say so."""
        if actor.alive:
            self._drop(actor, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
            self.check_alive()

    def _drop(self, actor: Actor, why: str) -> None:
        actor.alive = False
        log.warning("coordl remote prep: %r lost (%s); its batches are prepped in the trainer", actor, why)

    def check_alive(self) -> None:
        """One warning when no actor is left: the loader goes on with local prep only."""
        if not self.live() and not self.lost_warned:
            self.lost_warned = True
            warnings.warn(
                f"coordl remote prep: no actor left on the Ray cluster at {self.prep.address}; "
                "the loader goes on with local prep only",
                RuntimeWarning,
                stacklevel=3,
            )

    # -- stats and lifetime ---------------------------------------------------------------------------

    def reset_stats(self) -> None:
        """Zero the ``remote_*`` counters (the loader's :meth:`reset_stats`)."""
        self.counts = dict.fromkeys(COUNTER_NAMES, 0)

    def stats(self) -> dict[str, Any]:
        """``remote_*`` counters, plus ``remote_actors`` (live now) and ``remote_shipped_actors``."""
        out: dict[str, Any] = dict(self.counts)
        out["remote_actors"] = len(self.live())
        out["remote_shipped_actors"] = sum(1 for a in self.live() if a.ship)
        return out

    def close(self) -> None:
        """Stop the actors (the connection stays: it is this process's, maybe the user's)."""
        if self.closed:
            return
        self.closed = True
        if self._merged is not None:
            self._merged.stop()
        for actor in self.actors:
            if actor.alive:
                try:
                    self.ray.kill(actor.handle)
                except Exception:  # the cluster may be gone already: nothing left to stop
                    pass
                actor.alive = False


def attach(prep: Any, loader: Any) -> RemoteSide | None:
    """The remote side of ``loader`` for its ``remote_prep=`` argument (None: none), after checking that
    its other options allow it (each refusal names the option)."""
    if prep is None:
        return None
    if not isinstance(prep, RemotePrep):
        raise TypeError(f"remote_prep must be a coordl.RemotePrep or None, got {type(prep).__name__}")
    inner = getattr(loader, "_inner", None)
    refusals = [
        (inner is None, "a map-style dataset (an IterableDataset's items have no index to send)"),
        (loader.coordinate is not None, "coordinate=None (a coordinated group preps once for all its jobs)"),
        (loader.sample_cache is not None, "sample_cache=None"),
        (loader.on_error != "raise", 'on_error="raise"'),
        (loader.batch_size is None and loader.batch_sampler is None, "batches (batch_size or batch_sampler)"),
        (
            getattr(getattr(inner, "_keys", None), "batched", None) is not None,
            "a dataset without its own __getitems__ (its batch load is not item by item)",
        ),
    ]
    for refused, needs in refusals:
        if refused:
            raise ValueError(f"remote_prep needs {needs}")
    assert inner is not None  # a map-style loader has its LoaderSource by now
    return RemoteSide(prep, loader.source, inner.fetch, loader.collate_fn)

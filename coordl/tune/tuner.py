"""``coordl.DataLoader(tune=True)``: the loader measures each epoch and changes its own knobs between epochs.

Each epoch's steady part is measured (:class:`EpochClock`: the items, the wall time, the time the loop
waited in ``next()``, the main process's and the workers' CPU). At the epoch's end the tuner judges the
change it made at that epoch's start (kept if the epoch measured faster than the best so far by
``min_gain``, else reverted at the next epoch's start), then picks the next change: the untried knob
whose predicted rate (:mod:`coordl.tune.model`) is highest, if it promises ``min_gain`` or more; where more
than one promises it, all of them together first (the model's best point in one epoch), then one at a time if
that measured worse. One trial per epoch, each logged with its predicted and measured rate (``loader.tune_log()``).

What it changes: ``num_workers`` (up to the cores, or twice them for workers that wait on storage, within
the memory available), ``prefetch_factor`` (where the pipeline lost to bursts what a deeper queue may
absorb), and the main process's intra-op threads (``torch.set_num_threads(1)`` when the trainer's threads
take the workers' cores, or, as a trial the model cannot predict, whenever those threads and the workers
outnumber the cores while the loop waits on the loader or its step computes on this CPU and the host leaves
no quarter of the cores idle: :func:`coordl.tune.model.contended`).
A window shorter than ``min_items`` is judged with the next epoch's; a change measured within the noise
(``doubt``) runs a second epoch and is judged on both.
What it does not change online, and why: ``cache_bytes`` (the MinIO cache is a shared-memory table sized
at construction and mapped by every worker: a new size is a new, empty cache), ``batch_size`` (it changes
the training), ``partitioned``/``coordinate``/``sample_cache``/``remote_prep`` (other processes and servers
take part), and ``fetch_ahead`` (set in the fetch path the workers copy when they start; fixed per loader).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import psutil
import torch

from coordl.shutdown import stop_workers
from coordl.tune.model import (
    EpochMeasure,
    Knobs,
    contended,
    data_bound,
    merged,
    predict_rate,
    storage_bound,
    with_knob,
)

__all__ = ["EpochClock", "TunedEpoch", "TuneOptions", "Tuner", "idle_cpu_s"]

log = logging.getLogger("coordl")


@dataclass(frozen=True)
class TuneOptions:
    """``tune=`` of ``coordl.DataLoader``: ``True`` is ``TuneOptions()``.

    Args:
        knobs: which knobs it may change, of ``"num_workers"``, ``"prefetch_factor"``, ``"intra_op_threads"``.
        min_gain: a change is tried only if predicted, and kept only if measured, this much faster (0.03: 3%).
        max_workers: the most workers it may run (default: twice the cores this process may use).
        min_items: a window (an epoch's steady part) shorter than this is not judged alone: the next
            epoch's, at the same knobs, is added to it.
        doubt: a change that measured less than ``min_gain`` faster but no more than this much slower than
            the rate before is within a shared host's noise between epochs: it runs one more epoch and
            is judged on both (0.15: 15%).
    """

    knobs: tuple[str, ...] = ("num_workers", "prefetch_factor", "intra_op_threads")
    min_gain: float = 0.03
    max_workers: int | None = None
    min_items: int = 256
    doubt: float = 0.15

    def __post_init__(self) -> None:
        unknown = set(self.knobs) - {"num_workers", "prefetch_factor", "intra_op_threads"}
        if unknown:
            raise ValueError(f"tune: unknown knobs {sorted(unknown)}")
        if not 0 <= self.min_gain < 1:
            raise ValueError(f"tune: min_gain must be in [0, 1), got {self.min_gain}")
        if not 0 <= self.doubt < 1:
            raise ValueError(f"tune: doubt must be in [0, 1), got {self.doubt}")


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def idle_cpu_s() -> float:
    """Seconds the CPUs this process may run on have been idle (waiting on I/O counts), summed over them."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    total = 0.0
    for i, c in enumerate(psutil.cpu_times(percpu=True)):
        if allowed is None or i in allowed:
            total += c.idle + getattr(c, "iowait", 0.0)
    return total


def _children_cpu_s() -> float:
    """CPU of this process's children, live and reaped (a worker that exited counts too)."""
    t = os.times()
    total = t.children_user + t.children_system
    for child in psutil.Process().children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.Error:
            pass
    return total


class EpochClock:
    """Times one epoch's batches from the loop's side; the window starts after the workers' first round."""

    def __init__(self, skip_batches: int, batch_size: int) -> None:
        self.skip, self.batch_size = skip_batches, batch_size
        self.batches = 0
        self.wait_s = 0.0
        self.receive_cpu_s = 0.0
        self.start: tuple[float, float, float, float] | None = None
        self.end: tuple[float, float, float, float] | None = None

    def _now(self) -> tuple[float, float, float, float]:
        return time.perf_counter(), time.process_time(), _children_cpu_s(), idle_cpu_s()

    def waited(self, seconds: float, cpu_s: float = 0.0) -> None:
        """A batch arrived after the loop waited ``seconds`` for it, ``cpu_s`` of them on its thread's CPU."""
        self.batches += 1
        if self.batches == self.skip:
            self.start = self._now()
        elif self.batches > self.skip:
            self.wait_s += seconds
            self.receive_cpu_s += min(cpu_s, seconds)
            self.end = None

    def close(self) -> None:
        if self.end is None and self.start is not None:
            self.end = self._now()

    def measure(self, knobs: Knobs) -> EpochMeasure | None:
        self.close()
        if self.start is None or self.end is None:
            return None
        items = (self.batches - self.skip) * self.batch_size
        wall = self.end[0] - self.start[0]
        if items <= 0 or wall <= 0:
            return None
        return EpochMeasure(
            items, wall, min(self.wait_s, wall), self.end[1] - self.start[1], self.end[2] - self.start[2],
            knobs, cores(), min(self.receive_cpu_s, self.wait_s), max(self.end[3] - self.start[3], 0.0) / wall,
        )  # fmt: skip


class Tuner:
    """The decisions of ``tune=True`` for one loader (see the module's docstring)."""

    def __init__(self, loader: Any, options: TuneOptions) -> None:
        self.loader, self.options = loader, options
        self.log: list[dict[str, Any]] = []
        self.epoch = 0
        self.clock: EpochClock | None = None
        self.best: tuple[Knobs, float] | None = None  # the knobs kept, and their measured rate
        self.trial: dict[str, Any] | None = None  # the change this epoch runs, judged at its end
        self.pending: Knobs | None = None  # the knobs the next epoch starts with
        self.tried: set[str] = set()
        self.window: EpochMeasure | None = None  # measured at the knobs now, not judged yet (too short)
        self.extended = False  # the trial runs a second epoch (it measured within the noise)

    # -- the loader's knobs --------------------------------------------------------------------

    def knobs(self) -> Knobs:
        return Knobs(
            int(self.loader.num_workers), int(self.loader.prefetch_factor or 2), int(torch.get_num_threads())
        )

    def _apply(self, knobs: Knobs) -> None:
        now = self.knobs()
        if knobs.num_workers != now.num_workers or knobs.prefetch_factor != now.prefetch_factor:
            inner = self.loader._torch
            stop_workers(getattr(inner, "_iterator", None))  # persistent workers: new ones take the change
            inner._iterator = None
            self.loader.num_workers = knobs.num_workers
            for target in (self.loader, inner):
                target.prefetch_factor = knobs.prefetch_factor if knobs.num_workers else None
        if knobs.intra_op_threads != now.intra_op_threads:
            torch.set_num_threads(knobs.intra_op_threads)

    # -- epochs --------------------------------------------------------------------------------

    def epoch_starts(self) -> EpochClock:
        """At ``iter()``: close the last epoch if the loop left it early, apply the next knobs, start timing."""
        if self.clock is not None:
            self._epoch_ended()
        if self.pending is not None:
            self._apply(self.pending)
            self.pending = None
        k = self.knobs()
        batch = self.loader.batch_size or 1
        self.clock = EpochClock(max(1, k.num_workers) * (k.prefetch_factor if k.num_workers else 1), batch)
        return self.clock

    def epoch_ended(self) -> None:
        """At the epoch's last batch (or its ``StopIteration``)."""
        if self.clock is not None:
            self._epoch_ended()

    def _epoch_ended(self) -> None:
        clock, self.clock = self.clock, None
        assert clock is not None
        m = clock.measure(self.knobs())
        self.epoch += 1
        if m is not None:
            self.observe(m)

    def observe(self, m: EpochMeasure) -> None:
        """Judge the epoch's change on ``m`` (what the epoch measured, with the window before it at the same
        knobs when that was too short or in doubt), then choose the next one."""
        if self.window is not None and self.window.knobs == m.knobs:
            m = merged(self.window, m)
        self.window = None
        if m.items < self.options.min_items:
            self.window = m  # too short to judge: the next epoch's window is added to it
            return
        knobs = m.knobs
        if self.trial is not None:
            if not self.extended and self._in_doubt(m):
                self.extended, self.window = True, m  # one more epoch of the trial, judged on both
                return
            self._judge(self.trial, m)
            self.trial, self.extended = None, False
        elif self.best is None or knobs == self.best[0]:
            self.best = (knobs, m.rate)  # the kept knobs again: their rate as the host runs now
        if self.pending is None:
            self._choose(m)

    def _in_doubt(self, m: EpochMeasure) -> bool:
        """Whether the trial measured within the noise of the rate before (neither a gain nor a clear loss)."""
        assert self.best is not None
        before = self.best[1]
        return before * (1 - self.options.doubt) <= m.rate < before * (1 + self.options.min_gain)

    def _judge(self, trial: dict[str, Any], m: EpochMeasure) -> None:
        assert self.best is not None
        before_knobs, before = self.best
        kept = m.rate >= before * (1 + self.options.min_gain)
        entry = {**trial, "measured_items_per_s": m.rate, "kept": kept}
        self.log.append(entry)
        if kept:
            self.best = (m.knobs, m.rate)
        else:
            self.pending = before_knobs  # reverted at the next epoch's start
        log.info("coordl tune: %s", _describe(entry))

    def _choose(self, m: EpochMeasure) -> None:
        assert self.best is not None
        best_knobs, best_rate = self.best
        if not data_bound(m) and m.knobs.intra_op_threads == 1:
            return  # the trainer's own time binds: nothing of the loader's would help
        options = []
        for name, knobs in self._candidates(m, best_knobs):
            predicted = predict_rate(m, knobs)
            if name == "intra_op_threads=1" and contended(m):
                # the model has no term for the contention: a trial, predicted no lower than the rate
                # measured, tried first (more workers would add to it)
                options.append((float("inf"), max(predicted, best_rate), name, knobs))
            elif predicted >= best_rate * (1 + self.options.min_gain):
                options.append((predicted, predicted, name, knobs))
        if not options:
            return
        if len(options) > 1:  # every promising change at once: the model's best point in one epoch
            knobs = _joined(best_knobs, [o[3] for o in options])
            name = "+".join(o[2] for o in sorted(options, key=lambda o: o[2]))
            if name not in self.tried:
                predicted = max(predict_rate(m, knobs), *(o[1] for o in options))
                options.append((float("inf"), predicted, name, knobs))
        _, predicted, name, knobs = max(options, key=lambda o: (o[0], "+" in o[2]))
        self.tried.add(name)
        self.pending = knobs
        self.trial = {
            "epoch": self.epoch, "knob": name, "change": _change(best_knobs, knobs),
            "before_items_per_s": best_rate, "predicted_items_per_s": predicted,
        }  # fmt: skip

    def _candidates(self, m: EpochMeasure, k: Knobs) -> list[tuple[str, Knobs]]:
        allowed, out = self.options.knobs, []
        waits = storage_bound(m)
        most = self.options.max_workers or (2 * m.cores if waits else m.cores)
        watch = getattr(self.loader, "_watch", None)  # the worker table's rows bound num_workers
        most = min(most, watch.num_workers) if watch is not None else most
        if "num_workers" in allowed and k.num_workers < most and self._memory_for_a_worker():
            more = min(most, max(k.num_workers + 1, 2 * k.num_workers if waits else k.num_workers + 1))
            out.append((f"num_workers={more}", with_knob(k, num_workers=more)))
        if "prefetch_factor" in allowed and k.prefetch_factor < 8:  # promising only where the model missed
            out.append(
                (
                    f"prefetch_factor={2 * k.prefetch_factor}",
                    with_knob(k, prefetch_factor=2 * k.prefetch_factor),
                )
            )
        if "intra_op_threads" in allowed and k.intra_op_threads > 1 and (m.main_cores > 1.0 or contended(m)):
            out.append(("intra_op_threads=1", with_knob(k, intra_op_threads=1)))
        return [(name, knobs) for name, knobs in out if name not in self.tried]

    def _memory_for_a_worker(self) -> bool:
        """Whether the memory available holds one more worker twice over (its private memory, measured)."""
        iterator = getattr(self.loader._torch, "_iterator", None)
        sizes = []
        for w in getattr(iterator, "_workers", ()) or ():
            try:
                sizes.append(psutil.Process(w.pid).memory_full_info().uss)
            except (psutil.Error, ValueError):
                pass
        need = 2 * max(sizes, default=256 << 20)
        return psutil.virtual_memory().available > need


def _joined(base: Knobs, changes: list[Knobs]) -> Knobs:
    """``base`` with every knob that any of ``changes`` moves set as that change sets it."""
    b = asdict(base)
    joined = dict(b)
    for k in changes:
        joined.update({name: v for name, v in asdict(k).items() if v != b[name]})
    return Knobs(**joined)


def _change(before: Knobs, after: Knobs) -> str:
    b, a = asdict(before), asdict(after)
    return ", ".join(f"{k} {b[k]} -> {a[k]}" for k in b if b[k] != a[k])


def _describe(entry: dict[str, Any]) -> str:
    verdict = "kept" if entry["kept"] else "reverted"
    return (
        f"epoch {entry['epoch']}: {entry['change']}: predicted {entry['predicted_items_per_s']:.0f}, "
        f"measured {entry['measured_items_per_s']:.0f} items/s (before {entry['before_items_per_s']:.0f}): {verdict}"
    )


class TunedEpoch:
    """The epoch's iterator as the user gets it with ``tune=True``: times each ``next()`` for the tuner."""

    def __init__(self, inner: Any, tuner: Tuner, clock: EpochClock, length: int | None) -> None:
        self._inner, self._tuner, self._clock, self._length = inner, tuner, clock, length
        self._given = 0

    def __iter__(self) -> TunedEpoch:
        return self

    def __next__(self) -> Any:
        t, cpu = time.perf_counter(), time.thread_time()
        try:
            batch = next(self._inner)
        except StopIteration:
            self._tuner.epoch_ended()
            raise
        self._clock.waited(time.perf_counter() - t, time.thread_time() - cpu)
        self._given += 1
        if self._given == self._length:  # Lightning and Accelerate stop here, never asking for StopIteration
            self._clock.close()
        return batch

    def __len__(self) -> int:
        return len(self._inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

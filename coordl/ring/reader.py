"""Collate batches into a reused ring of shared-memory slots instead of fresh shared memory.

torch's ``default_collate`` stacks each batch of a worker into *newly allocated* shared memory, which
is then passed by file descriptor to the main process. Memory touched for the first time costs page
faults (on some VMs 10x the copy itself), plus one ``shm_open``, fd transfer and mapping per batch.
Here each worker owns one segment of ``S`` batch-sized slots: it stacks a batch into a free slot
(pages touched once, then reused) and sends only a small :class:`RingBatch` descriptor through
torch's result queue. The main process maps the segment once, hands the user tensors that view the
slot (zero copy), and marks the slot free when the last tensor using it is freed.

Rules that keep it safe:

* a slot has one int32 state in the segment header: 0 free, 1 lent. Only the worker sets 1, only the
  main process sets 0, so no lock is needed;
* no free slot (the user holds many batches), a structure it cannot hold, or no room in ``/dev/shm``:
  that batch goes through ``default_collate`` as before. Never a wait, never a bus error;
* the worker's own heap: a batch keeps its samples alive until they are stacked, and glibc then
  returns that freed memory to the OS, so each batch's samples would fault in fresh pages again.
  A worker with a ring keeps freed memory for the next batch (``mallopt``, glibc only);
* the main process maps a segment when it unpickles the first descriptor naming it (torch's result
  queue is FIFO per worker, so that is before torch can tell the worker to exit), then unlinks its
  name, so nothing stays in ``/dev/shm`` if a worker is killed later; the worker unlinks it at exit
  if the main process never mapped it, and :func:`shmem.segment.reclaim_stale` removes it after a
  ``kill -9`` of both.

This module is the main process's side: it maps each worker's segment, rebuilds batches as views of
their slot and gives slots back. The worker's side (collating into a slot, the descriptor, the
segment's layout) is :mod:`coordl.ring.writer`.
"""

from __future__ import annotations

import itertools
import mmap
import os
import threading
import weakref
from typing import Any

import numpy as np
import torch
from torch.utils.data.dataloader import default_collate

from coordl.ring.layout import build
from coordl.ring.slots import FREE, HEADER_BYTES, MAPPED_STATES, RECEIVERS, RingBatch, Stacked
from coordl.ring.writer import RingCollate
from shmem.segment import SEGMENT_NAME_RE, owner_alive, start_ticks

__all__ = ["BatchRing", "RingBatch", "RingCollate", "Stacked", "EXTRA_SLOTS"]

# Slots beyond prefetch_factor: the batch the user holds, the one being unpacked, reordering slack.
EXTRA_SLOTS = 3

_RING_KEYS = itertools.count(1)


def _give_back(states: np.ndarray, slot: int, held: set[int]) -> None:
    held.discard(slot)
    states[slot] = FREE


class _Mapping:
    """The main process's mapping of one worker's segment (its name is removed once mapped).

    The descriptor stays open, so that the workers of the next epoch (forked from this process) can
    take the segment over when its writer has exited: their slots then reuse pages that already exist
    instead of faulting in fresh ones, which under memory pressure means reclaiming page cache first.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR)
        size = os.fstat(self.fd).st_size
        self.mmap = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        weakref.finalize(self, os.close, self.fd).atexit = False
        try:
            os.unlink(path)  # the mapping stays valid; nothing is left in /dev/shm whatever happens next
        except FileNotFoundError:
            pass
        self.states = np.frombuffer(self.mmap, dtype=np.int32, count=HEADER_BYTES // 4)
        self.held: set[int] = set()  # slots whose batch the user still holds
        m = SEGMENT_NAME_RE.match(os.path.basename(path))
        self.reusable = m is not None  # its writer can be told apart from a live process
        # (pid, start ticks) of the process that writes into it now; None: none (it has exited)
        self.writer: tuple[int, int] | None = (int(m["pid"]), int(m["start"])) if m else None
        MAPPED_STATES[path] = self.states

    def writer_gone(self) -> bool:
        return self.reusable and (self.writer is None or not owner_alive(*self.writer))


class BatchRing:
    """The loader's side of the ring: the collate function for torch, and batch rebuilding.

    Args:
        prefetch_factor: the loader's (torch's default 2 when None).
        batch_size: the loader's batch size.
        copy: hand out private copies and free each slot at once, instead of views of the slot.
    """

    def __init__(self, prefetch_factor: int | None, batch_size: int | None, *, copy: bool = False) -> None:
        key = next(_RING_KEYS)
        self.collate = RingCollate((prefetch_factor or 2) + EXTRA_SLOTS, batch_size, receiver=key)
        RECEIVERS[key] = self
        self.copy = copy
        self._maps: dict[str, _Mapping] = {}
        self._maps_lock = threading.Lock()  # torch's pin-memory thread receives batches too
        self._iter_ref: Any = None
        self._slots_seen: set[tuple[str, int]] = set()
        self.counts = {
            "ring_batches": 0, "ring_stacked": 0, "ring_fallbacks": 0, "ring_slots": 0, "ring_adopted": 0,
            "ring_in_place": 0,
        }  # fmt: skip
        self._offered: dict[int, _Mapping] = {}

    def offer_segments(self, num_workers: int) -> None:
        """Before torch forks an epoch's workers: offer them the segments of workers that have exited.

        Only when the previous torch iterator is gone (its buffered descriptors died with it and gave
        their slots back; one still alive could later free a slot a new worker has taken), and only
        segments whose writer has exited. Their slots are marked free except those holding a batch the
        user still has.
        """
        previous = self._iter_ref() if self._iter_ref is not None else None
        self._offered = {}
        if previous is not None:
            return
        with self._maps_lock:
            spare = [m for m in self._maps.values() if m.writer_gone()]
        for worker_id, mapping in zip(range(num_workers), spare, strict=False):
            for slot in range(self.collate.num_slots):
                if slot not in mapping.held:
                    mapping.states[slot] = FREE
            self._offered[worker_id] = mapping
        self.collate.adopt = {w: (m.path, m.fd, m.mmap) for w, m in self._offered.items()}

    def start_epoch(self, torch_iter: Any) -> None:
        """After ``iter()``: keep the mappings the new workers took over, forget the others' (persistent
        workers: nothing changes)."""
        self.collate.adopt = {}  # the forked workers have their copy
        current = self._iter_ref() if self._iter_ref is not None else None
        if current is torch_iter:
            return
        # Keep what the new workers took over, and segments still written for another live iterator;
        # forget the rest (batches the user holds keep their own mapping alive).
        offered = {m.path: m for m in self._offered.values()}
        with self._maps_lock:
            self._maps = {p: m for p, m in self._maps.items() if p in offered or not m.writer_gone()}
        workers = getattr(torch_iter, "_workers", [])
        for worker_id, mapping in self._offered.items():
            pid = workers[worker_id].pid if worker_id < len(workers) else None
            mapping.writer = _process_tag(pid)
            self.counts["ring_adopted"] += 1
        self._offered = {}
        try:
            self._iter_ref = weakref.ref(torch_iter)
        except TypeError:
            self._iter_ref = None

    def receive(self, batch: RingBatch) -> None:
        """A descriptor was just unpickled in this process: map its segment now, while its writer lives.

        Called from :meth:`RingBatch.__setstate__`, in whichever thread reads torch's result queue.
        """
        with self._maps_lock:
            if batch.path not in self._maps:
                self._maps[batch.path] = _Mapping(batch.path)

    def unwrap(self, batch: Any) -> Any:
        """The user's batch for what torch yielded: a descriptor is rebuilt, anything else passes."""
        if type(batch) is not RingBatch:
            self.counts["ring_fallbacks"] += 1
            return batch
        mapping = self._maps.get(batch.path)
        if mapping is None:
            if batch.lost is not None:
                raise RuntimeError(
                    f"DataLoader: the shared-memory segment {batch.path} of a batch could not be mapped "
                    f"when the batch arrived ({batch.lost}); is /dev/shm full or cleaned by another process?"
                )
            self.receive(batch)  # a descriptor unpickled before this ring existed (not made by coordl)
            mapping = self._maps[batch.path]
        key = (batch.path, batch.slot)
        if key not in self._slots_seen:
            self._slots_seen.add(key)
            self.counts["ring_slots"] += 1
        self.counts["ring_batches"] += 1
        self.counts["ring_stacked"] += batch.stacked
        self.counts["ring_in_place"] += batch.in_place
        slot = np.frombuffer(mapping.mmap, dtype=np.uint8, count=batch.nbytes, offset=batch.offset)
        # The tensors' storage keeps ``slot`` alive; when the last of them dies, the slot goes back.
        mapping.held.add(batch.slot)
        weakref.finalize(slot, _give_back, mapping.states, batch.slot, mapping.held).atexit = False
        batch._held = False  # from here the slot is freed by the batch's tensors, not the descriptor
        storage = torch.from_numpy(slot).untyped_storage()
        del slot
        tensors = [
            # (torch's stubs require a stride with an offset; torch takes the contiguous one without)
            torch.empty(0, dtype=dtype).set_(storage, off // dtype.itemsize, shape)  # type: ignore[call-overload]
            for off, dtype, shape in batch.leaves
        ]
        del storage
        if batch.pin or self.copy:
            # Copies (pinned when torch's pin thread asked): dropping the views frees the slot now.
            tensors = [_copy(v, batch.pin) for v in tensors]
        scalars = [_collate_scalar(v, batch.pin) for v in batch.scalars]
        return build(batch.spec, iter(tensors), iter(scalars))

    def stats(self) -> dict[str, int]:
        return dict(self.counts)

    def close(self) -> None:
        RECEIVERS.pop(self.collate.receiver, None)
        self._maps.clear()
        self._offered = {}
        self.collate.adopt = {}
        self._iter_ref = None


def _process_tag(pid: int | None) -> tuple[int, int] | None:
    """(pid, start ticks) of a live process, or None (unknown or already gone: nothing to wait for)."""
    if pid is None:
        return None
    try:
        return pid, start_ticks(pid)
    except Exception:  # noqa: BLE001 - psutil.NoSuchProcess and friends: the worker is gone
        return None


def _copy(view: torch.Tensor, pin: bool) -> torch.Tensor:
    return torch.empty(view.shape, dtype=view.dtype, pin_memory=pin).copy_(view)


def _collate_scalar(values: list, pin: bool) -> Any:
    out = default_collate(values)
    return _copy(out, pin) if pin and isinstance(out, torch.Tensor) else out

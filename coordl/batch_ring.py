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
* the main process unlinks the segment's name as soon as it has mapped it, so nothing stays in
  ``/dev/shm`` if a worker is killed later; the worker unlinks it at exit if the main process never
  mapped it, and :func:`coordl.shm.reclaim_stale` removes it after a ``kill -9`` of both.
"""

from __future__ import annotations

import ctypes
import mmap
import multiprocessing.util
import os
import weakref
from typing import Any

import numpy as np
import torch
import torch.utils.data
from torch.utils.data.dataloader import default_collate

from coordl.batch_layout import ALIGN, align, build, gather, has_ring_leaf, leaf_layout, spec_of
from coordl.shm import DEFAULT_DIR, SEGMENT_NAME_RE, Segment, free_bytes, owner_alive, start_ticks

__all__ = ["BatchRing", "RingBatch", "RingCollate", "Stacked", "EXTRA_SLOTS"]

# Slots beyond prefetch_factor: the batch the user holds, the one being unpacked, reordering slack.
EXTRA_SLOTS = 3
_PAGE = 4096
_HEADER_BYTES = _PAGE  # one int32 state per slot; slots start on a page boundary
_FREE, _LENT = 0, 1


# -- descriptor ------------------------------------------------------------------------------------


class RingBatch:
    """What crosses torch's result queue instead of a batch: where it lies and how to rebuild it."""

    def __init__(
        self, path: str, slot: int, offset: int, nbytes: int, leaves: list, scalars: list, spec: tuple
    ) -> None:
        self.path, self.slot, self.offset, self.nbytes = path, slot, offset, nbytes
        self.leaves = leaves  # per ring leaf: (byte offset in slot, torch dtype, batch shape)
        self.scalars = scalars  # per scalar leaf: the raw values, collated by the main process
        self.spec = spec
        self.pin = False
        self.stacked = False  # stacked sample by sample as they were made (Stacker), not at collate
        self.in_place = 0  # of its samples, those a transform wrote straight into the slot
        self._held = False  # True in the receiving process until the batch is built

    def pin_memory(self, device: Any = None) -> RingBatch:
        # torch's pin thread calls this; the main thread then copies into pinned memory.
        self.pin = True
        return self

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_held"] = False
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._held = True

    def __del__(self) -> None:
        # Dropped unbuilt (early break, persistent workers resuming, worker error): give the slot back.
        if getattr(self, "_held", False):
            self._held = False
            try:
                _release_unbuilt(self.path, self.slot)
            except Exception:  # noqa: BLE001 - interpreter shutdown or the worker already gone
                pass


# Header views of the segments this process has mapped, so a dropped descriptor can free its slot.
_MAPPED: weakref.WeakValueDictionary[str, np.ndarray] = weakref.WeakValueDictionary()


def _release_unbuilt(path: str, slot: int) -> None:
    states = _MAPPED.get(path)
    if states is not None:
        states[slot] = _FREE
        return
    try:  # never mapped here: write the state through the file (still named: the worker is alive)
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        return
    try:
        os.pwrite(fd, np.int32(_FREE).tobytes(), slot * 4)
    finally:
        os.close(fd)


def _give_back(states: np.ndarray, slot: int, held: set[int]) -> None:
    held.discard(slot)
    states[slot] = _FREE


# -- worker side -----------------------------------------------------------------------------------


class _WorkerRing:
    """One worker's segment: ``num_slots`` slots of ``slot_bytes``, reserved as first needed."""

    def __init__(
        self, spec: tuple, slot_bytes: int, num_slots: int, directory: str, segment: Segment | None = None
    ) -> None:
        self.spec, self.slot_bytes, self.num_slots = spec, slot_bytes, num_slots
        self.adopted = segment is not None
        if segment is None:
            segment = Segment.create("ring", _HEADER_BYTES + num_slots * slot_bytes, directory)
            # The worker exits through multiprocessing, which skips atexit: unlink there if never mapped.
            multiprocessing.util.Finalize(None, segment.unlink, exitpriority=0)
        self.segment = segment
        self.directory = directory
        self.usable = 0  # slots reserved so far
        self.capped = not self._reserve(0, _HEADER_BYTES)
        self.states = self.segment.array(np.int32, 0, num_slots)
        self.next = 0

    def _reserve(self, offset: int, nbytes: int) -> bool:
        try:
            return self.segment.reserve(offset, nbytes)
        except OSError:  # e.g. ENOMEM from a memory cgroup: treat like a full /dev/shm
            return False

    def take_slot(self) -> int | None:
        """A free slot, now marked lent, or None."""
        for k in range(self.usable):
            slot = (self.next + k) % self.usable
            if self.states[slot] == _FREE:
                self.states[slot] = _LENT
                self.next = slot + 1
                return slot
        while not self.capped and self.usable < self.num_slots:
            # Leave room for a batch of torch's own fallback, so taking a slot never starves it.
            # (An adopted segment's slots already have their pages: reserving them takes nothing.)
            if (not self.adopted and free_bytes(self.directory) < 2 * self.slot_bytes) or not self._reserve(
                _HEADER_BYTES + self.usable * self.slot_bytes, self.slot_bytes
            ):
                self.capped = True
                return None
            slot = self.usable
            self.usable += 1
            if self.states[slot] == _FREE:  # an adopted slot may still hold a batch the user keeps
                self.states[slot] = _LENT
                self.next = slot + 1
                return slot
        return None

    def collate(self, batch: list) -> RingBatch | None:
        rings: list[list] = []
        scalars: list[list] = []
        if not gather(self.spec, batch, rings, scalars):
            return None
        layouts, offset = [], 0
        for values in rings:
            layout = leaf_layout(values)
            if layout is None:
                return None
            layouts.append((offset, *layout))
            offset = align(offset + len(values) * layout[2], ALIGN)
        if offset == 0 or offset > self.slot_bytes:
            return None
        slot = self.take_slot()
        if slot is None:
            return None
        base = _HEADER_BYTES + slot * self.slot_bytes
        n = len(batch)
        try:
            for values, (off, dtype, shape, per_sample) in zip(rings, layouts, strict=True):
                self._stack(values, base + off, n * per_sample, dtype, (n, *shape))
        except Exception:  # noqa: BLE001 - let default_collate run and raise its own error, if any
            self.states[slot] = _FREE
            return None
        leaves = [(off, dtype, (n, *shape)) for off, dtype, shape, _ in layouts]
        return RingBatch(self.segment.path, slot, base, self.slot_bytes, leaves, scalars, self.spec)

    def _stack(self, values: list, offset: int, nbytes: int, dtype: torch.dtype, shape: tuple) -> None:
        out = self.rows(offset, nbytes, dtype, shape, values[0])
        (np.stack if type(out) is np.ndarray else torch.stack)(values, out=out)

    def rows(self, offset: int, nbytes: int, dtype: torch.dtype, shape: tuple, like: Any) -> Any:
        """Segment bytes at ``offset`` as a batch of ``shape``: a NumPy array for array leaves, else a tensor."""
        raw = self.segment.array(np.uint8, offset, nbytes)
        if type(like) is np.ndarray:
            return raw.view(like.dtype).reshape(shape)
        return torch.from_numpy(raw).view(dtype).view(shape)


class RingCollate:
    """``default_collate`` that, inside a loader worker, collates into that worker's ring.

    Created in the main process and pickled or forked into the workers; each worker makes its
    segment at its first batch. Outside a worker it is exactly ``default_collate``.

    Args:
        num_slots: slots per worker (``prefetch_factor + EXTRA_SLOTS``).
        batch_size: the loader's batch size (slots hold this many samples), or None to size them by
            the first batch.
        directory: where segments live (``/dev/shm``).
    """

    def __init__(self, num_slots: int, batch_size: int | None, directory: str = DEFAULT_DIR) -> None:
        self.num_slots, self.batch_size, self.directory = int(num_slots), batch_size, directory
        # Set by the main process just before it forks an epoch's workers: worker id -> a segment of
        # the previous epoch's workers (path, fd, mapping) to stack into instead of a new one.
        self.adopt: dict[int, tuple[str, int, mmap.mmap]] = {}
        self._ring: _WorkerRing | None = None
        self._disabled = False
        self._pid = -1

    def __getstate__(self) -> dict:
        return {"num_slots": self.num_slots, "batch_size": self.batch_size, "directory": self.directory}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def __call__(self, batch: list) -> Any:
        if type(batch) is Stacked:
            return batch.batch
        if not batch or torch.utils.data.get_worker_info() is None:
            return default_collate(batch)
        if self._pid != os.getpid():  # a new worker process: its own ring, made at its first batch
            self._ring, self._disabled, self._pid = None, False, os.getpid()
        if self._ring is None and not self._disabled:
            self._ring = self._make_ring(batch)
            self._disabled = self._ring is None
        out = self._ring.collate(batch) if self._ring is not None else None
        return out if out is not None else default_collate(batch)

    def stacker(self, n: int) -> Any:
        """In a worker whose ring exists: a free slot to stack ``n`` samples into as they are made.

        None before the worker's first batch (it goes through ``__call__``, which makes the ring),
        outside a worker, or when no slot is free. The dataset calls this; see
        :class:`coordl.stacker.Stacker`.
        """
        if self._pid != os.getpid() or self._ring is None:
            return None
        slot = self._ring.take_slot()
        if slot is None:
            return None
        from coordl.stacker import Stacker  # its own module; it imports this one

        return Stacker(self._ring, slot, n)

    def _adoptable(self, slot_bytes: int) -> Segment | None:
        """The segment the main process offered this worker, if its slots have this size."""
        offer = self.adopt.get(getattr(torch.utils.data.get_worker_info(), "id", None))
        self.adopt = {}
        if offer is None:
            return None
        path, fd, mapping = offer
        if len(mapping) != _HEADER_BYTES + self.num_slots * slot_bytes:
            return None
        return Segment.inherited(path, fd, mapping)

    def _make_ring(self, batch: list) -> _WorkerRing | None:
        spec = spec_of(batch[0])
        if spec is None or not has_ring_leaf(spec):
            return None
        rings: list[list] = []
        if not gather(spec, batch, rings, []):
            return None
        capacity = max(self.batch_size or 0, len(batch))
        slot_bytes = 0
        for values in rings:
            layout = leaf_layout(values)
            if layout is None:
                return None
            slot_bytes = align(slot_bytes + capacity * layout[2], ALIGN)
        slot_bytes = align(max(slot_bytes, 1), _PAGE)
        try:
            ring = _WorkerRing(spec, slot_bytes, self.num_slots, self.directory, self._adoptable(slot_bytes))
        except OSError:
            return None
        if ring.capped:  # not even the header fits: no ring in this worker
            ring.segment.close()
            return None
        _keep_freed_heap(2 * ring.slot_bytes)
        return ring


class Stacked:
    """A batch the dataset already stacked into a slot; the ring's collate passes it through."""

    __slots__ = ("batch",)

    def __init__(self, batch: RingBatch) -> None:
        self.batch = batch


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling on 64-bit


def _keep_freed_heap(batch_bytes: int) -> None:
    """Keep up to ``batch_bytes`` (at least 64 MiB) of freed heap in this process instead of trimming.

    Setting one threshold turns off glibc's own adaptation of both, so both are set: blocks up to
    32 MiB come from the heap (not a fresh mmap each), and the heap top is trimmed only beyond.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):  # not glibc
        return
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)
    mallopt(_M_TRIM_THRESHOLD, min(max(batch_bytes, 64 << 20), 1 << 30))


# -- main side -------------------------------------------------------------------------------------


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
        self.states = np.frombuffer(self.mmap, dtype=np.int32, count=_HEADER_BYTES // 4)
        self.held: set[int] = set()  # slots whose batch the user still holds
        m = SEGMENT_NAME_RE.match(os.path.basename(path))
        self.reusable = m is not None  # its writer can be told apart from a live process
        # (pid, start ticks) of the process that writes into it now; None: none (it has exited)
        self.writer: tuple[int, int] | None = (int(m["pid"]), int(m["start"])) if m else None
        _MAPPED[path] = self.states

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
        self.collate = RingCollate((prefetch_factor or 2) + EXTRA_SLOTS, batch_size)
        self.copy = copy
        self._maps: dict[str, _Mapping] = {}
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
        spare = [m for m in self._maps.values() if m.writer_gone()]
        for worker_id, mapping in zip(range(num_workers), spare, strict=False):
            for slot in range(self.collate.num_slots):
                if slot not in mapping.held:
                    mapping.states[slot] = _FREE
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

    def unwrap(self, batch: Any) -> Any:
        """The user's batch for what torch yielded: a descriptor is rebuilt, anything else passes."""
        if type(batch) is not RingBatch:
            self.counts["ring_fallbacks"] += 1
            return batch
        mapping = self._maps.get(batch.path)
        if mapping is None:
            mapping = self._maps[batch.path] = _Mapping(batch.path)
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
            torch.empty(0, dtype=dtype).set_(storage, off // dtype.itemsize, shape)
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

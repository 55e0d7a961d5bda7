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
from coordl.shm import DEFAULT_DIR, Segment, free_bytes

__all__ = ["BatchRing", "RingBatch", "RingCollate", "Stacked", "Stacker", "EXTRA_SLOTS"]

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


def _give_back(states: np.ndarray, slot: int) -> None:
    states[slot] = _FREE


# -- worker side -----------------------------------------------------------------------------------


class _WorkerRing:
    """One worker's segment: ``num_slots`` slots of ``slot_bytes``, reserved as first needed."""

    def __init__(self, spec: tuple, slot_bytes: int, num_slots: int, directory: str) -> None:
        self.spec, self.slot_bytes, self.num_slots = spec, slot_bytes, num_slots
        self.segment = Segment.create("ring", _HEADER_BYTES + num_slots * slot_bytes, directory)
        self.directory = directory
        # The worker exits through multiprocessing, which skips atexit: unlink there if never mapped.
        multiprocessing.util.Finalize(None, self.segment.unlink, exitpriority=0)
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
        if self.capped or self.usable == self.num_slots:
            return None
        # Leave room for a batch of torch's own fallback, so taking a slot never starves it.
        if free_bytes(self.directory) < 2 * self.slot_bytes or not self._reserve(
            _HEADER_BYTES + self.usable * self.slot_bytes, self.slot_bytes
        ):
            self.capped = True
            return None
        slot = self.usable
        self.usable += 1
        self.states[slot] = _LENT
        self.next = slot + 1
        return slot

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

    def stacker(self, n: int) -> Stacker | None:
        """In a worker whose ring exists: a free slot to stack ``n`` samples into as they are made.

        None before the worker's first batch (it goes through ``__call__``, which makes the ring),
        outside a worker, or when no slot is free. The dataset calls this; see :class:`Stacker`.
        """
        if self._pid != os.getpid() or self._ring is None:
            return None
        slot = self._ring.take_slot()
        return None if slot is None else Stacker(self._ring, slot, n)

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
        try:
            ring = _WorkerRing(spec, align(max(slot_bytes, 1), _PAGE), self.num_slots, self.directory)
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


class Stacker:
    """Stacks one batch's samples into a slot as each is made, instead of holding them all.

    A worker that keeps its batch's samples until collate holds ``batch_size`` fresh tensors (19 MB for
    32 ImageNet crops) and then stacks them out of cold memory; copying each sample into its row while
    it is still in the CPU cache, and freeing it, lets the allocator hand the same hot memory to the
    next sample. ``add`` returns None while samples fit the slot's layout; on the first that does not
    (another shape, dtype or structure) it frees the slot and returns every sample so far as plain
    objects, and the caller goes on without the stacker (torch's collate then decides).
    """

    def __init__(self, ring: _WorkerRing, slot: int, n: int) -> None:
        self.ring, self.slot, self.n = ring, slot, n
        self.base = _HEADER_BYTES + slot * ring.slot_bytes
        self.count = 0
        self._leaves: list[tuple[int, torch.dtype, tuple, type, Any]] = []  # off, dtype, shape, type, rows
        self._scalars: list[list] = []

    def add(self, sample: Any) -> list | None:
        rings: list[list] = []
        scalars: list[list] = []
        if not gather(self.ring.spec, [sample], rings, scalars):
            return self.abort() + [sample]
        values = [v for (v,) in rings]
        if not (self._matches(values) if self._leaves else self._lay_out(values)):
            return self.abort() + [sample]
        if self.count == 0:
            self._scalars = [[] for _ in scalars]
        for (*_layout, rows), value in zip(self._leaves, values, strict=True):
            if type(value) is torch.Tensor:
                rows[self.count].copy_(value)
            else:
                rows[self.count] = value
        for acc, (value,) in zip(self._scalars, scalars, strict=True):
            acc.append(value)
        self.count += 1
        return None

    def _matches(self, values: list) -> bool:
        for (_off, dtype, shape, kind, _rows), value in zip(self._leaves, values, strict=True):
            layout = leaf_layout([value]) if type(value) is kind else None
            if layout is None or layout[0] != dtype or tuple(layout[1]) != shape:
                return False
        return True

    def _lay_out(self, values: list) -> bool:
        """Place each leaf's ``n`` rows in the slot, from the first sample's layout."""
        offset = 0
        for value in values:
            layout = leaf_layout([value])
            if layout is None or offset + self.n * layout[2] > self.ring.slot_bytes:
                self._leaves = []
                return False
            dtype, shape, per_sample = layout
            rows = self.ring.rows(self.base + offset, self.n * per_sample, dtype, (self.n, *shape), value)
            self._leaves.append((offset, dtype, tuple(shape), type(value), rows))
            offset = align(offset + self.n * per_sample, ALIGN)
        return bool(self._leaves)

    def abort(self) -> list:
        """Free the slot; the samples stacked so far, rebuilt as default_collate would see them."""
        out = []
        for k in range(self.count):
            leaves = [
                rows[k].clone() if kind is torch.Tensor else rows[k].copy()
                for *_l, kind, rows in self._leaves
            ]
            out.append(build(self.ring.spec, iter(leaves), iter([acc[k] for acc in self._scalars])))
        self._release()
        return out

    def finish(self) -> Stacked | list:
        """The batch for collate: a :class:`Stacked` descriptor, or ``[]`` if every sample was skipped."""
        if self.count == 0:
            self._release()
            return []
        leaves = [(off, dtype, (self.count, *shape)) for off, dtype, shape, _k, _r in self._leaves]
        self._leaves = []  # the row views must not outlive the batch in this process
        batch = RingBatch(
            self.ring.segment.path,
            self.slot,
            self.base,
            self.ring.slot_bytes,
            leaves,
            self._scalars,
            self.ring.spec,
        )
        batch.stacked = True
        return Stacked(batch)

    def _release(self) -> None:
        self._leaves = []
        self.ring.states[self.slot] = _FREE


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
    """The main process's mapping of one worker's segment (its name is removed once mapped)."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            self.mmap = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        try:
            os.unlink(path)  # the mapping stays valid; nothing is left in /dev/shm whatever happens next
        except FileNotFoundError:
            pass
        self.states = np.frombuffer(self.mmap, dtype=np.int32, count=_HEADER_BYTES // 4)
        _MAPPED[path] = self.states


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
        self.counts = {"ring_batches": 0, "ring_stacked": 0, "ring_fallbacks": 0, "ring_slots": 0}

    def start_epoch(self, torch_iter: Any) -> None:
        """Forget the mappings of workers gone with a previous torch iterator (persistent ones stay)."""
        current = self._iter_ref() if self._iter_ref is not None else None
        if current is not torch_iter:
            self._maps.clear()  # held batches keep their own mapping alive
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
        slot = np.frombuffer(mapping.mmap, dtype=np.uint8, count=batch.nbytes, offset=batch.offset)
        # The tensors' storage keeps ``slot`` alive; when the last of them dies, the slot goes back.
        weakref.finalize(slot, _give_back, mapping.states, batch.slot).atexit = False
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
        self._iter_ref = None


def _copy(view: torch.Tensor, pin: bool) -> torch.Tensor:
    return torch.empty(view.shape, dtype=view.dtype, pin_memory=pin).copy_(view)


def _collate_scalar(values: list, pin: bool) -> Any:
    out = default_collate(values)
    return _copy(out, pin) if pin and isinstance(out, torch.Tensor) else out

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
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.utils.data
from torch.utils.data.dataloader import default_collate

from coordl.shm import DEFAULT_DIR, Segment, free_bytes

__all__ = ["BatchRing", "RingBatch", "RingCollate", "EXTRA_SLOTS"]

# Slots beyond prefetch_factor: the batch the user holds, the one being unpacked, reordering slack.
EXTRA_SLOTS = 3
_PAGE = 4096
_ALIGN = 64
_HEADER_BYTES = _PAGE  # one int32 state per slot; slots start on a page boundary
_FREE, _LENT = 0, 1
# Spec node kinds: a stacked leaf in the slot, a small leaf collated by the main process, containers.
_RING, _SCALAR, _TUPLE, _LIST, _DICT = range(5)
_SCALAR_TYPES = (int, float, bool, str, bytes)
_TENSOR_DTYPES = frozenset(
    {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8, torch.int16,
     torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128}
)  # fmt: skip
_NUMPY_DTYPES = {
    np.dtype(n): getattr(torch, t)
    for n, t in [("float32", "float32"), ("float64", "float64"), ("float16", "float16"), ("uint8", "uint8"),
                 ("int8", "int8"), ("int16", "int16"), ("int32", "int32"), ("int64", "int64"),
                 ("bool", "bool"), ("complex64", "complex64"), ("complex128", "complex128")]
}  # fmt: skip


def _align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


# -- the structure of a sample ---------------------------------------------------------------------


def _spec_of(obj: Any) -> tuple | None:
    """The structure of one sample, or None when the ring cannot hold it (default_collate decides)."""
    t = type(obj)
    if t is torch.Tensor or t is np.ndarray:
        return (_RING,)
    if t in _SCALAR_TYPES or isinstance(obj, (np.number, np.bool_)):
        return (_SCALAR,)
    if t is tuple or t is list:
        children = tuple(_spec_of(x) for x in obj)
        return None if None in children else (_TUPLE if t is tuple else _LIST, children)
    if t is dict:
        children = tuple(_spec_of(v) for v in obj.values())
        return None if None in children else (_DICT, tuple(obj), children)
    return None


def _has_ring_leaf(spec: tuple) -> bool:
    if spec[0] == _RING:
        return True
    return spec[0] != _SCALAR and any(_has_ring_leaf(c) for c in spec[-1])


def _gather(spec: tuple, samples: list, rings: list[list], scalars: list[list]) -> bool:
    """Transpose ``samples`` along ``spec`` into per-leaf lists; False if any sample differs."""
    kind = spec[0]
    if kind in (_RING, _SCALAR):
        first = type(samples[0])
        if any(type(s) is not first for s in samples):
            return False
        (rings if kind == _RING else scalars).append(samples)
        return True
    if kind == _DICT:
        keys = spec[1]
        if any(type(s) is not dict or len(s) != len(keys) for s in samples) or tuple(samples[0]) != keys:
            return False  # default_collate orders keys as the batch's first sample does
        try:
            return all(
                _gather(child, [s[k] for s in samples], rings, scalars)
                for k, child in zip(keys, spec[2], strict=True)
            )
        except KeyError:
            return False
    want = tuple if kind == _TUPLE else list
    children = spec[1]
    if any(type(s) is not want or len(s) != len(children) for s in samples):
        return False
    return all(_gather(child, [s[i] for s in samples], rings, scalars) for i, child in enumerate(children))


def _leaf_layout(values: list) -> tuple[torch.dtype, tuple[int, ...], int] | None:
    """(torch dtype, sample shape, bytes per sample) of a ring leaf, or None if it cannot be stacked."""
    first = values[0]
    if type(first) is torch.Tensor:
        if (
            first.dtype not in _TENSOR_DTYPES
            or first.layout != torch.strided
            or first.device.type != "cpu"
            or first.requires_grad  # default_collate refuses these with its own error
            or first.is_nested
        ):
            return None
        shape, dtype = first.shape, first.dtype
        if any(v.shape != shape or v.dtype != dtype or v.requires_grad for v in values):
            return None
        return dtype, tuple(shape), first.numel() * first.element_size()
    dtype = _NUMPY_DTYPES.get(first.dtype)
    if dtype is None:
        return None
    if any(v.shape != first.shape or v.dtype != first.dtype for v in values):
        return None
    return dtype, first.shape, first.nbytes


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
        if not _gather(self.spec, batch, rings, scalars):
            return None
        layouts, offset = [], 0
        for values in rings:
            layout = _leaf_layout(values)
            if layout is None:
                return None
            layouts.append((offset, *layout))
            offset = _align(offset + len(values) * layout[2], _ALIGN)
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
        raw = self.segment.array(np.uint8, offset, nbytes)
        if type(values[0]) is np.ndarray:
            np.stack(values, out=raw.view(values[0].dtype).reshape(shape))
        else:
            torch.stack(values, out=torch.from_numpy(raw).view(dtype).view(shape))


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
        if not batch or torch.utils.data.get_worker_info() is None:
            return default_collate(batch)
        if self._pid != os.getpid():  # a new worker process: its own ring, made at its first batch
            self._ring, self._disabled, self._pid = None, False, os.getpid()
        if self._ring is None and not self._disabled:
            self._ring = self._make_ring(batch)
            self._disabled = self._ring is None
        out = self._ring.collate(batch) if self._ring is not None else None
        return out if out is not None else default_collate(batch)

    def _make_ring(self, batch: list) -> _WorkerRing | None:
        spec = _spec_of(batch[0])
        if spec is None or not _has_ring_leaf(spec):
            return None
        rings: list[list] = []
        if not _gather(spec, batch, rings, []):
            return None
        capacity = max(self.batch_size or 0, len(batch))
        slot_bytes = 0
        for values in rings:
            layout = _leaf_layout(values)
            if layout is None:
                return None
            slot_bytes = _align(slot_bytes + capacity * layout[2], _ALIGN)
        try:
            ring = _WorkerRing(spec, _align(max(slot_bytes, 1), _PAGE), self.num_slots, self.directory)
        except OSError:
            return None
        if ring.capped:  # not even the header fits: no ring in this worker
            ring.segment.close()
            return None
        _keep_freed_heap(2 * ring.slot_bytes)
        return ring


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
        self.counts = {"ring_batches": 0, "ring_fallbacks": 0, "ring_slots": 0}

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
        return _build(batch.spec, iter(tensors), iter(scalars))

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


def _build(spec: tuple, tensors: Iterator, scalars: Iterator) -> Any:
    """The batch default_collate would have made: tuples and lists become lists, dicts stay dicts."""
    kind = spec[0]
    if kind == _RING:
        return next(tensors)
    if kind == _SCALAR:
        return next(scalars)
    if kind == _DICT:
        return {k: _build(child, tensors, scalars) for k, child in zip(spec[1], spec[2], strict=True)}
    return [_build(child, tensors, scalars) for child in spec[1]]

"""The batch ring: the same batches as torch's default collate, slots reused only when freed, no leaks."""

from __future__ import annotations

import os
import pickle
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

import coordl
from coordl.errors import WorkerDiedError
from coordl.ring import reader as batch_ring
from coordl.ring import slots as ring_slots
from shmem.segment import Segment
from tests.coordl.ldr_sources import MemorySource, PidSource
from tests.coordl.ldr_sources import TorchReference as Reference

ROOT = Path(__file__).resolve().parents[2]
SLOTS = 2 + batch_ring.EXTRA_SLOTS  # torch's default prefetch_factor


class StructSource(MemorySource):
    """Items whose prep returns a structure of kind ``kind`` (tensors, arrays and small leaves)."""

    def __init__(self, n: int, kind: str) -> None:
        super().__init__(n)
        self.kind = kind

    def prep(self, raw: bytes, index: int):
        image = torch.arange(12, dtype=torch.float32).reshape(3, 4) + index
        if self.kind == "tensor":
            return image
        if self.kind == "tuple":
            return image, index
        if self.kind == "dict":
            return {
                "image": image.to(torch.bfloat16),
                "mask": np.full((2, 2), index % 2 == 0),
                "path": f"img-{index}.jpg",
                "weight": index / 7,
                "scale": np.float32(index),
                "pair": [torch.tensor([index, -index], dtype=torch.int16), np.int64(index)],
            }
        if self.kind == "unsupported":  # default_collate handles it; the ring must step aside
            return (image, None) if index >= 1000 else (image, [index] * (1 + index % 2))
        raise ValueError(self.kind)


def assert_same(ours, theirs) -> None:
    """Equal values, types, dtypes and shapes, recursively."""
    assert type(ours) is type(theirs), (type(ours), type(theirs))
    if isinstance(ours, torch.Tensor):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        assert torch.equal(ours, theirs)
    elif isinstance(ours, dict):
        assert list(ours) == list(theirs)
        for k in ours:
            assert_same(ours[k], theirs[k])
    elif isinstance(ours, list):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            assert_same(a, b)
    else:
        assert ours == theirs


def ring_files(pids) -> list[str]:
    pattern = re.compile(r"^coordl-ring-(\d+)-")
    return [n for n in os.listdir("/dev/shm") if (m := pattern.match(n)) and int(m[1]) in set(pids)]


@pytest.mark.parametrize("kind", ["tensor", "tuple", "dict"])
@pytest.mark.parametrize("persistent", [False, True])
def test_same_batches_as_torch(kind: str, persistent: bool) -> None:
    src = StructSource(23, kind)  # batches of 4: the last one is short
    kw = dict(batch_size=4, num_workers=2, persistent_workers=persistent)
    theirs = torch.utils.data.DataLoader(Reference(src), **kw)
    with coordl.DataLoader(src, **kw) as ours:
        for _ in range(3):
            got, want = list(ours), list(theirs)
            assert len(got) == len(want) == 6
            for a, b in zip(got, want, strict=True):
                assert_same(a, b)
        s = ours.stats()
        # Each worker's first batch makes its ring at collate; later ones are stacked as they are made.
        assert s["ring_batches"] > 0 and s["ring_stacked"] > 0


def test_spawned_workers_stack_too() -> None:
    # The dataset and the collate function are pickled into each worker: they must still share the ring.
    src = StructSource(24, "tuple")
    kw = dict(batch_size=4, num_workers=2)
    with coordl.DataLoader(src, multiprocessing_context="spawn", **kw) as ours:
        for a, b in zip(list(ours), list(torch.utils.data.DataLoader(Reference(src), **kw)), strict=True):
            assert_same(a, b)
        assert ours.stats()["ring_stacked"] == 4


class OddSampleSource(StructSource):
    """Dict samples; item ``odd`` differs (key order, or image shape) from the rest of its batch."""

    def __init__(self, n: int, odd: int, how: str) -> None:
        super().__init__(n, "dict")
        self.odd, self.how = odd, how

    def prep(self, raw: bytes, index: int):
        sample = super().prep(raw, index)
        if index == self.odd and self.how == "key order":
            return dict(reversed(list(sample.items())))
        if index == self.odd and self.how == "shape":
            sample["image"] = torch.zeros(3, 5, dtype=torch.bfloat16)
        return sample


def test_a_sample_unlike_the_others_mid_batch_gives_torchs_result() -> None:
    # Item 14 is the third of the fourth batch: two samples are already in the slot when it comes.
    src = OddSampleSource(24, odd=14, how="key order")
    kw = dict(batch_size=4, num_workers=2, persistent_workers=True)
    with coordl.DataLoader(src, **kw) as ours:
        for _ in range(2):
            for a, b in zip(list(ours), list(torch.utils.data.DataLoader(Reference(src), **kw)), strict=True):
                assert_same(a, b)
        s = ours.stats()
    # 12 batches: each worker's first (it makes the ring) is collated whole. Small samples are stacked a
    # group at a time with collate's own checks: a dict whose keys come in another order after the batch's
    # first sample is stacked in the first one's order, as default_collate orders it.
    assert (s["ring_batches"], s["ring_stacked"], s["ring_fallbacks"]) == (12, 10, 0)
    src = OddSampleSource(24, odd=14, how="shape")
    with coordl.DataLoader(src, **kw) as ours, pytest.raises(RuntimeError, match="stack expects each tensor"):
        list(ours)  # torch's own error for tensors of different sizes, as with torch's loader


def test_skipped_items_leave_no_gap_in_a_stacked_batch() -> None:
    src = MemorySource(40, bad=(5, 6, 9, 12, 13, 14, 15))  # batch 3 (items 12-15) is all bad
    with coordl.DataLoader(src, batch_size=4, num_workers=2, on_error="skip", persistent_workers=True) as dl:
        for _ in range(2):
            got = [b[:, 0].tolist() for b in dl]
            assert got[:3] == [[0, 1, 2, 3], [4, 7], [8, 10, 11]] and [16, 17, 18, 19] in got
            assert sorted(i for b in got for i in b) == sorted(set(range(40)) - src.bad)
        assert dl.stats()["ring_stacked"] > 0


def test_unsupported_structure_falls_back_to_torch() -> None:
    src = StructSource(12, "unsupported")  # a list leaf of varying length: torch's collate decides
    with coordl.DataLoader(src, batch_size=1, num_workers=2) as ours:
        theirs = torch.utils.data.DataLoader(Reference(src), batch_size=1, num_workers=2)
        for a, b in zip(list(ours), list(theirs), strict=True):
            assert_same(a, b)
        assert ours.stats()["ring_fallbacks"] > 0


def test_held_batches_stay_intact_past_the_ring() -> None:
    src = StructSource(120, "tuple")
    with coordl.DataLoader(src, batch_size=4, num_workers=2) as ours:
        held = list(ours)  # 30 batches held at once: more than the 2 x SLOTS slots
        parts = [(b[0][1:], b[0].numpy(), b[1]) for b in held]  # views and numpy views of them
        more = list(ours)  # another epoch while all of them are still alive
        want = list(torch.utils.data.DataLoader(Reference(src), batch_size=4))
        for batch, (sliced, array, labels), ref in zip(held, parts, want, strict=True):
            assert_same(batch, ref)
            assert torch.equal(sliced, ref[0][1:]) and np.array_equal(array, ref[0].numpy())
            assert torch.equal(labels, ref[1])
        for a, b in zip(more, want, strict=True):
            assert_same(a, b)
        s = ours.stats()
    assert s["ring_batches"] > 0 and s["ring_fallbacks"] > 0  # the ring filled up, torch took over
    assert s["ring_batches"] + s["ring_fallbacks"] == 60


def test_slots_are_reused() -> None:
    with coordl.DataLoader(MemorySource(160), batch_size=4, num_workers=2, persistent_workers=True) as dl:
        for _ in range(3):
            assert sum(len(b) for b in dl) == 160
        s = dl.stats()
    assert s["ring_slots"] <= 2 * SLOTS
    assert s["ring_batches"] > 3 * s["ring_slots"]  # 120 batches through at most 10 slots


@pytest.mark.parametrize("mode", [False, "copy"])
def test_ring_off_and_copy_mode_give_the_same_batches(mode) -> None:
    src = StructSource(23, "dict")
    theirs = list(torch.utils.data.DataLoader(Reference(src), batch_size=5))
    with coordl.DataLoader(src, batch_size=5, num_workers=2, batch_ring=mode) as ours:
        got = list(ours)
        s = ours.stats()
    for a, b in zip(got, theirs, strict=True):
        assert_same(a, b)
    assert ("ring_batches" in s) is (mode == "copy")


def test_no_ring_without_workers_or_with_a_collate_fn() -> None:
    with coordl.DataLoader(MemorySource(8), batch_size=4) as dl:
        assert [b[:, 0].tolist() for b in dl] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert "ring_batches" not in dl.stats()
    with coordl.DataLoader(MemorySource(8), batch_size=4, num_workers=2, collate_fn=list) as dl:
        assert [len(b) for b in dl] == [4, 4]
        assert "ring_batches" not in dl.stats()
    with pytest.raises(ValueError, match="batch_ring"):
        coordl.DataLoader(MemorySource(8), batch_ring="yes")


def test_pin_memory_request_keeps_values() -> None:
    src = StructSource(10, "tuple")
    ours = coordl.DataLoader(src, batch_size=4, num_workers=2, pin_memory=True)
    with ours, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: pin_memory without an accelerator does nothing
        got = list(ours)
    for a, b in zip(got, torch.utils.data.DataLoader(Reference(src), batch_size=4), strict=True):
        assert_same(a, b)


# -- what frees a slot (in one process: the ring's two sides without torch's workers) ---------------


@pytest.fixture
def one_process_ring(monkeypatch):
    """(collate, ring, send): collate as a worker would, ``send`` pickles across as torch does."""
    monkeypatch.setattr(batch_ring.torch.utils.data, "get_worker_info", lambda: object())
    ring = batch_ring.BatchRing(prefetch_factor=2, batch_size=4)
    yield ring.collate, ring, lambda desc: pickle.loads(pickle.dumps(desc))
    ring.close()


def _samples(start: int) -> list:
    return [(torch.full((3, 5), float(i)), i) for i in range(start, start + 4)]


def _states(ring: batch_ring.BatchRing) -> list[int]:
    (mapping,) = ring._maps.values()
    return mapping.states[:SLOTS].tolist()


def _lent(ring: batch_ring.BatchRing, slot: int) -> bool:
    return _states(ring)[slot] == 1


def test_a_slot_is_lent_until_every_tensor_of_its_batch_is_gone(one_process_ring) -> None:
    collate, ring, send = one_process_ring
    desc = send(collate(_samples(0)))
    images, labels = ring.unwrap(desc)
    assert _lent(ring, desc.slot)
    keep = images[1:2].to(torch.float32)  # a same-dtype .to() returns a view: still the slot
    del images, labels
    assert _lent(ring, desc.slot)
    del keep
    assert not _lent(ring, desc.slot)

    desc = send(collate(_samples(4)))
    batch = ring.unwrap(desc)
    first = batch[0]  # the user keeps batch[0] only
    del batch
    assert _lent(ring, desc.slot)
    copied = first.to(torch.float64)  # a real copy: the slot is not needed for it
    arr = first.numpy()
    del first
    assert _lent(ring, desc.slot)  # the numpy view still uses it
    del arr
    assert not _lent(ring, desc.slot) and copied[0, 0, 0].item() == 4.0


def test_reused_slot_does_not_change_a_held_batch(one_process_ring) -> None:
    collate, ring, send = one_process_ring
    held = ring.unwrap(send(collate(_samples(0))))
    for start in range(4, 4 + 4 * 3 * SLOTS, 4):
        out = collate(_samples(start))  # with `held` alive, its slot is never picked
        if isinstance(out, ring_slots.RingBatch):
            images, _ = ring.unwrap(send(out))
            assert images[0, 0, 0].item() == start
            del images
    assert held[0][:, 0, 0].tolist() == [0.0, 1.0, 2.0, 3.0] and held[1].tolist() == [0, 1, 2, 3]


def test_a_lent_row_given_back_in_a_plain_sample_no_longer_views_the_slot(one_process_ring) -> None:
    from coordl.ring.output_buffers import lend, new_output

    collate, _ring, _send = one_process_ring
    assert isinstance(collate(_samples(0)), ring_slots.RingBatch)  # the first batch makes the ring
    stacker = collate.stacker(4)
    with lend(stacker.take):
        assert stacker.add((torch.full((3, 5), 7.0), 7)) is None  # lays the slot out
        row = new_output((3, 5))  # the second sample's row
        start, end = stacker._slot_range
        assert start <= row.data_ptr() < end
        row.fill_(8.0)
        rest = stacker.add((row[:2], 8))  # another shape: the samples go back as plain objects
    assert [label for _image, label in rest] == [7, 8]
    image = rest[1][0]
    assert not start <= image.data_ptr() < end and image.shape == (2, 5) and bool((image == 8).all())
    assert collate._ring.states[stacker.slot] == ring_slots.FREE


def test_full_ring_returns_a_plain_batch(one_process_ring) -> None:
    collate, ring, send = one_process_ring
    held = [ring.unwrap(send(collate(_samples(4 * i)))) for i in range(SLOTS)]
    out = collate(_samples(100))  # every slot lent: torch's collate, no waiting
    assert isinstance(out, list) and out[0][:, 0, 0].tolist() == [100.0, 101.0, 102.0, 103.0]
    del held[2]
    assert isinstance(collate(_samples(200)), ring_slots.RingBatch)


def test_descriptor_dropped_unbuilt_frees_its_slot(one_process_ring) -> None:
    collate, ring, send = one_process_ring
    kept = ring.unwrap(send(collate(_samples(0))))  # maps the segment
    dropped = send(collate(_samples(4)))
    slot = dropped.slot
    assert _lent(ring, slot)
    del dropped  # torch discarded it (early break, resume of persistent workers)
    assert not _lent(ring, slot)
    assert kept[1].tolist() == [0, 1, 2, 3]


def test_pinned_or_copied_batches_free_the_slot_at_once(one_process_ring, monkeypatch) -> None:
    collate, ring, send = one_process_ring
    # No accelerator here: pinning is a plain copy for the test; what matters is when the slot is freed.
    monkeypatch.setattr(batch_ring, "_copy", lambda view, pin: view.clone())
    desc = send(collate(_samples(0)))
    images, labels = ring.unwrap(desc.pin_memory())
    assert not _lent(ring, desc.slot)
    assert images[:, 0, 0].tolist() == [0.0, 1.0, 2.0, 3.0] and labels.tolist() == [0, 1, 2, 3]


# -- small /dev/shm --------------------------------------------------------------------------------


def test_no_room_in_shm_falls_back_cleanly(monkeypatch) -> None:
    src = StructSource(40, "tuple")
    with coordl.DataLoader(src, batch_size=4, num_workers=2) as ours:
        # Patched after construction: the workers, forked at iteration, see it; no ring can reserve.
        monkeypatch.setattr(Segment, "reserve", lambda self, offset, length: False)
        got = list(ours)
        s = ours.stats()
    for a, b in zip(got, torch.utils.data.DataLoader(Reference(src), batch_size=4), strict=True):
        assert_same(a, b)
    assert s["ring_batches"] == 0 and s["ring_fallbacks"] == 10


def test_room_for_some_slots_only(monkeypatch) -> None:
    calls = {"n": 0}
    real = Segment.reserve

    def two_reservations(self, offset, length):  # header and one slot, per worker
        calls["n"] += 1
        return real(self, offset, length) if calls["n"] <= 2 else False

    src = StructSource(80, "tuple")
    with coordl.DataLoader(src, batch_size=4, num_workers=2) as ours:
        monkeypatch.setattr(Segment, "reserve", two_reservations)
        held = list(ours)
        s = ours.stats()
    for a, b in zip(held, torch.utils.data.DataLoader(Reference(src), batch_size=4), strict=True):
        assert_same(a, b)
    assert s["ring_slots"] <= 2 and s["ring_batches"] >= 1 and s["ring_fallbacks"] > 0


# -- nothing left in /dev/shm ----------------------------------------------------------------------


def _worker_pids(batches) -> set[int]:
    return {int(p) for b in batches for p in b[:, 1]}


@pytest.mark.timeout(120)
def test_nothing_left_after_close_or_early_break() -> None:
    src = PidSource(64)
    dl = coordl.DataLoader(src, batch_size=4, num_workers=2, persistent_workers=True)
    pids = _worker_pids(dl)
    for i, b in enumerate(dl):
        pids |= _worker_pids([b])
        if i == 1:
            break  # batches in flight are dropped unbuilt
    assert ring_files(pids) == []  # the main process removes each name once it has mapped it
    dl.close()
    dl = coordl.DataLoader(src, batch_size=4, num_workers=2)
    before = {c.pid for c in psutil.Process().children()}  # e.g. a spawn resource tracker: not ours
    it = iter(dl)
    pids |= _worker_pids([next(it)])
    children = [c for c in psutil.Process().children() if c.pid not in before]
    del it  # the other worker may have made its ring without the main process ever mapping it
    dl.close()
    psutil.wait_procs(children, timeout=60)
    assert ring_files(pids | {c.pid for c in children}) == []


@pytest.mark.timeout(120)
def test_killed_worker_leaves_nothing_and_held_batches_stay_valid() -> None:
    src = PidSource(400)
    with coordl.DataLoader(src, batch_size=4, num_workers=2, persistent_workers=True) as dl:
        it = iter(dl)
        held = [next(it) for _ in range(4)]
        victim = int(held[0][0, 1])
        before = [b.clone() for b in held]
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(WorkerDiedError):
            for _ in it:
                pass
        assert ring_files({victim}) == []
        for b, c in zip(held, before, strict=True):
            assert torch.equal(b, c)  # the mapping outlives the worker and its name
        assert sum(len(b) for b in dl) == 400  # the next epoch starts fresh workers


SCRIPT = """
import sys, time
sys.path.insert(0, {root!r})
import coordl
from tests.coordl.ldr_sources import PidSource
dl = coordl.DataLoader(PidSource(400), batch_size=4, num_workers=2, persistent_workers=True)
it = iter(dl)
held = [next(it) for _ in range(6)]
print(" ".join(sorted({{str(int(p)) for b in held for p in b[:, 1]}})), flush=True)
time.sleep(120)
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_kill9_of_the_main_process_leaves_nothing() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT.format(root=str(ROOT))], stdout=subprocess.PIPE, text=True
    )
    try:
        pids = {int(p) for p in proc.stdout.readline().split()}
        assert len(pids) == 2
        workers = [psutil.Process(p) for p in pids]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        psutil.wait_procs(workers, timeout=90)  # torch's workers notice the parent is gone and exit
        deadline = time.monotonic() + 30
        while ring_files(pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ring_files(pids) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


# -- segments taken over by the next epoch's workers ---------------------------------------------


class NoisySource(MemorySource):
    """Items that differ every epoch (torch seeds each epoch's workers afresh)."""

    def prep(self, raw: bytes, index: int):
        return torch.rand(3, 16) + index, index


def _tuples_and_torchs_batches() -> tuple[StructSource, dict, list]:
    """40 tuple items, non-persistent loader arguments, and torch's batches for them."""
    src = StructSource(40, "tuple")
    kw = dict(batch_size=4, num_workers=2)
    return src, kw, list(torch.utils.data.DataLoader(Reference(src), **kw))


def test_next_epochs_workers_take_over_the_segments_of_exited_ones() -> None:
    src, kw, want = _tuples_and_torchs_batches()
    with coordl.DataLoader(src, **kw) as ours:
        for epoch in range(4):
            got = list(ours)
            for a, b in zip(got, want, strict=True):
                assert_same(a, b)
            if epoch == 0:
                slots_after_first = ours.stats()["ring_slots"]
        s = ours.stats()
    # Epochs 2-4 stacked into the first epoch's segments: no new slot (fresh pages) after epoch 1.
    assert s["ring_adopted"] == 2 * 3
    assert s["ring_slots"] == slots_after_first
    assert s["ring_stacked"] > 0


def test_a_batch_held_across_epochs_is_not_overwritten() -> None:
    torch.manual_seed(0)  # the workers' seeds (base_seed + id) are drawn from it: fixed draws
    with coordl.DataLoader(NoisySource(48), batch_size=4, num_workers=2) as ours:
        first = list(ours)  # every batch of epoch 1 held: their slots stay lent
        copies = [b[0].clone() for b in first]
        for _ in range(2):
            later = [b[0].clone() for b in ours]
            assert not torch.equal(later[0], copies[0])  # new content each epoch
        for batch, copy in zip(first, copies, strict=True):
            assert torch.equal(batch[0], copy)
        assert ours.stats()["ring_adopted"] == 4


def test_an_iterator_still_running_keeps_its_segments() -> None:
    src, kw, want = _tuples_and_torchs_batches()
    with coordl.DataLoader(src, **kw) as ours:
        list(ours)
        old = iter(ours)  # takes over epoch 1's segments
        got_old = [next(old)]
        # A second iterator while the first one's workers still write: nothing to take over.
        got_new = list(ours)
        got_old += list(old)
        for a, b, c in zip(got_old, got_new, want, strict=True):
            assert_same(a, c)
            assert_same(b, c)
        assert ours.stats()["ring_adopted"] == 2


def test_early_break_then_a_new_epoch_takes_over_safely() -> None:
    src, kw, want = _tuples_and_torchs_batches()
    with coordl.DataLoader(src, **kw) as ours:
        for _ in range(3):
            for i, batch in enumerate(ours):
                assert_same(batch, want[i])
                if i == 2:
                    break  # batches in flight are dropped unbuilt: their slots must come back
        for i, b in enumerate(ours):  # each batch dropped before the next: a slot is always free
            assert_same(b, want[i])
        s = ours.stats()
    assert s["ring_adopted"] == 2 * 3
    assert s["ring_fallbacks"] == 0  # no slot was lost to the dropped batches

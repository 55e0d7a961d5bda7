"""Resume anything, mid-epoch, against torchdata's StatefulDataLoader on the same datasets.

Each scenario interrupts a two-epoch run after every number of batches k (before the first batch, mid
epoch, at an epoch's last batch, in the second epoch), saves the state through JSON, resumes in a new
loader built under another global seed, and checks that the concatenation is the uninterrupted
stream, which is also torchdata's ``StatefulDataLoader``'s stream for the same seed.
"""

from __future__ import annotations

import logging

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

import coordl
from tests.coordl.resume_cases import (
    Items,
    OwnIterator,
    RandomItems,
    SeededStream,
    Stream,
    interrupted,
    stream,
)

pytestmark = pytest.mark.filterwarnings(
    "ignore::UserWarning"
)  # torchdata's set_vital, coordl's opaque-stage note


@pytest.fixture(autouse=True)
def _quiet_fast_forward(caplog) -> None:
    # both loaders log a warning for each fast-forwarded stream
    logging.getLogger("torchdata").setLevel(logging.ERROR)
    caplog.set_level(logging.ERROR, logger="coordl")


def _check(make, *, epochs: int = 2, parity: bool = True, ks=None) -> None:
    """Every k: coordl's resumed stream == its uninterrupted one (== torchdata's, with ``parity``)."""
    torch.manual_seed(0)
    full = stream(make(coordl.DataLoader), epochs)
    if parity:
        torch.manual_seed(0)
        assert full == stream(make(StatefulDataLoader), epochs), "coordl's stream is not torchdata's"
    per = len(full) // epochs
    for k in range(len(full) + 1) if ks is None else ks:
        got = interrupted(lambda: make(coordl.DataLoader), k, len(full))
        assert got == full, f"resumed after {k} batches (epoch {k // per}, batch {k % per})"


# -- map-style ----------------------------------------------------------------------------------------


# Shuffled without generator=, coordl draws torchdata's permutations: one randperm per pass from a
# generator seeded once from the global RNG. With workers torchdata makes its sampler iterator twice
# per worker start (torch's iterator calls iter() again in _reset) and so draws and drops one
# permutation more: the streams agree without workers only.


@pytest.mark.parametrize("workers", [0, 2])
def test_shuffle_without_generator_resumes_exactly(workers: int) -> None:
    _check(lambda L: L(Items(14), batch_size=4, shuffle=True, num_workers=workers), parity=workers == 0)


@pytest.mark.parametrize("workers", [0, 2])
def test_dataset_state_is_restored_in_each_worker(workers: int) -> None:
    """A dataset drawing from its own RNG in __getitem__: its state_dict is saved per worker."""
    _check(lambda L: L(RandomItems(14), batch_size=3, shuffle=True, num_workers=workers), parity=workers == 0)


def test_dataset_state_in_each_worker_matches_torchdata() -> None:
    _check(lambda L: L(RandomItems(14), batch_size=3, num_workers=3), ks=[0, 1, 2, 4, 5, 7, 10])


def test_dataset_state_with_persistent_workers() -> None:
    _check(lambda L: L(RandomItems(9), batch_size=3, num_workers=2, persistent_workers=True), epochs=3)


def test_stateful_sampler_positions_itself() -> None:
    """torchdata's StatefulDistributedSampler saves how many it yielded; no skipping by coordl."""

    def make(L):
        ds = Items(14)
        return L(ds, batch_size=4, num_workers=2, sampler=StatefulDistributedSampler(ds, 1, 0, shuffle=False))

    _check(make)


@pytest.mark.parametrize("batched", [False, True])
def test_a_samplers_own_generator_is_saved(batched: bool) -> None:
    """sampler=RandomSampler(..., generator=g) (or inside a batch sampler): g's state when the epoch
    began is saved, so a resume in a later epoch gets that epoch's order (torchdata would start g over)."""

    def make(L):
        sampler = torch.utils.data.RandomSampler(range(11), generator=torch.Generator().manual_seed(2))
        if batched:
            return L(Items(11), batch_sampler=torch.utils.data.BatchSampler(sampler, 3, False), num_workers=2)
        return L(Items(11), batch_size=3, sampler=sampler, num_workers=2)

    _check(make, epochs=3, parity=False, ks=[0, 2, 4, 5, 9, 11])


def test_generator_given_resumes_exactly_in_torchs_order() -> None:
    """With generator= the order is torch's own DataLoader's for that generator (torchdata draws its
    permutation before the workers' base seed, torch after: their orders differ)."""

    def make(L):
        return L(
            Items(10), batch_size=4, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(3)
        )

    _check(make, parity=False)
    assert stream(make(coordl.DataLoader), 2) == stream(make(torch.utils.data.DataLoader), 2)


# -- iterable-style -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("workers", "persistent", "stateful"),
    [(0, False, True), (3, False, True), (2, True, True)]
    + [pytest.param(*case, marks=pytest.mark.slow) for case in (
        (0, False, False), (2, False, True), (3, True, True), (2, False, False), (3, False, False), (3, True, False))],
)  # fmt: skip
def test_iterable_dataset_resumes_mid_epoch(workers: int, persistent: bool, stateful: bool) -> None:
    """Worker 0 finishes early; a Stateful iterator is restored in its worker, any other stream is
    replayed with the same worker seeds and the batches already handed out dropped."""
    _check(
        lambda L: L(
            Stream(13, stateful=stateful), batch_size=2, num_workers=workers, persistent_workers=persistent
        )
    )


def test_iterable_without_state_replays_with_the_same_worker_seeds() -> None:
    """The replayed epoch's workers get the saved epoch's seeds. (Later epochs' seeds come from the
    global RNG when they start, as in torch: restore it too to repeat them.)"""
    _check(lambda L: L(SeededStream(17), batch_size=2, num_workers=2), epochs=1)


def test_torchdatas_snapshot_argument_is_accepted() -> None:
    """snapshot_every_n_steps (StatefulDataLoader's): coordl's state is exact at every step anyway."""
    _check(lambda L: L(Stream(13), batch_size=2, num_workers=2, snapshot_every_n_steps=3), ks=[0, 1, 2, 4, 5])


@pytest.mark.parametrize("workers", [0, 2])
def test_dataset_that_is_its_own_iterator(workers: int) -> None:
    """Regression: the stream must not call iter() on the restored iterator again (it would rewind)."""
    _check(lambda L: L(OwnIterator(11), batch_size=2, num_workers=workers), ks=[0, 1, 2, 3, 5, 7])


def test_iterable_without_batching() -> None:
    _check(lambda L: L(Stream(9), batch_size=None, num_workers=2), ks=[0, 1, 4, 9])


# -- any moment ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_state_before_iter_and_between_epochs(workers: int) -> None:
    def make():
        return coordl.DataLoader(RandomItems(12), batch_size=4, shuffle=True, num_workers=workers)

    torch.manual_seed(0)
    full = stream(make(), 3)
    assert interrupted(make, 0, len(full)) == full  # before iter(): nothing taken
    for k in (3, 6):  # after the epoch's last batch, then once the iterator raised StopIteration
        assert interrupted(make, k, len(full), exhaust=True) == full


def test_load_after_iter_replaces_the_running_epoch() -> None:
    def make():
        return coordl.DataLoader(
            Items(12), batch_size=4, shuffle=True, num_workers=2, persistent_workers=True
        )

    torch.manual_seed(0)
    full = stream(make(), 2)
    for k in (0, 1, 4):
        assert interrupted(make, k, len(full), load_after_iter=True) == full


def test_an_empty_state_changes_nothing() -> None:
    """load_state_dict({}) is a no-op, as in torchdata (frameworks pass {} for "no state saved")."""
    with coordl.DataLoader(Items(12), batch_size=4) as dl:
        dl.load_state_dict({})
        assert [b.tolist() for b in dl] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_state_after_load_is_the_loaded_state() -> None:
    with coordl.DataLoader(Items(12), batch_size=4, shuffle=True) as dl:
        it = iter(dl)
        next(it)
        state = dl.state_dict()
    with coordl.DataLoader(Items(12), batch_size=4, shuffle=True) as dl:
        dl.load_state_dict(state)
        assert dl.state_dict() == state


# -- mismatches ---------------------------------------------------------------------------------------


def test_other_num_workers_or_length_is_a_clear_error() -> None:
    with coordl.DataLoader(Items(12), batch_size=4, shuffle=True, num_workers=2) as dl:
        state = dl.state_dict()
    cases = [
        (Items(12), {"shuffle": True, "num_workers": 3}, "num_workers=2 but this loader has num_workers=3"),
        (Items(16), {"shuffle": True, "num_workers": 2}, "num_items=12 but this loader has num_items=16"),
        (Stream(12), {"num_workers": 2}, "iterable=False but this loader has iterable=True"),
    ]
    for dataset, kwargs, message in cases:
        with (
            coordl.DataLoader(dataset, batch_size=4, **kwargs) as dl,
            pytest.raises(ValueError, match=message),
        ):
            dl.load_state_dict(state)
    # torchdata refuses another num_workers with an assert: code written for it catches AssertionError
    with coordl.DataLoader(Items(12), batch_size=4, num_workers=0) as dl, pytest.raises(AssertionError):
        dl.load_state_dict(state)


# -- coordl's tiers -----------------------------------------------------------------------------------


def test_caches_keep_their_contents(tmp_path) -> None:
    """Loading a state (here into the loader that is running) leaves the MinIO cache and the sample
    cache as they were: the resumed epoch reads nothing from storage and preps nothing again."""
    import memcache
    from tests.coordl.ldr_sources import SplitSource

    store = memcache.LocalStore(8 << 20, name="resume", directory=str(tmp_path))
    try:
        with coordl.DataLoader(SplitSource(24), batch_size=4, shuffle=True, num_workers=2,
                               cache_bytes=1 << 20, sample_cache=store) as dl:  # fmt: skip
            whole = [b.clone() for b in dl]  # fills both caches
            it = iter(dl)
            next(it)
            state = dl.state_dict()
            cached = {
                k: dl.stats()[k]
                for k in ("cached_items", "cached_bytes", "sample_cache_items", "sample_cache_used_bytes")
            }
            dl.load_state_dict(state)
            assert {k: dl.stats()[k] for k in cached} == cached
            before = dl.stats()
            rest = list(dl)
            after = dl.stats()
        assert len(rest) == len(whole) - 1
        assert after["storage_items_read"] == before["storage_items_read"]
        assert after["sample_cache_misses"] == before["sample_cache_misses"]  # every item prepped before
        assert after["sample_cache_hits"] > before["sample_cache_hits"]
    finally:
        store.close()


def test_batches_of_skipped_items_count_as_handed_out() -> None:
    """on_error="skip": a batch whose every item is corrupt is dropped, and counts as used up."""
    from tests.coordl.ldr_sources import MemorySource

    def make():
        return coordl.DataLoader(
            MemorySource(16, bad={4, 5, 6, 7}), batch_size=4, num_workers=2, on_error="skip"
        )

    with make() as dl:
        whole = [b.clone() for b in dl]
    assert len(whole) == 3
    with make() as dl:
        it = iter(dl)
        first = next(it)
        state = dl.state_dict()
    assert state["batches_done"] == 1
    with make() as dl:
        dl.load_state_dict(state)
        rest = list(dl)
    for a, b in zip([first, *rest], whole, strict=True):
        assert torch.equal(a, b)

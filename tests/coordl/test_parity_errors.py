"""Errors raised inside a worker, side by side with torch: the caller gets them for their batch and goes on.

torch re-raises an exception of the dataset (or of collate, or of ``worker_init_fn``) for the batch it
broke, and the iterator goes on with the next batch when the caller catches it and calls ``next`` again.
coordl does the same; only a worker that dies ends the epoch (``test_worker_death.py``). The loop here
is :func:`tests.coordl.parity_cases.outcomes`: each batch or error, in order, until ``StopIteration``.
"""

from __future__ import annotations

import time

import pytest

import coordl
from coordl.errors import CoordlTimeoutError, WorkerDiedError
from tests.coordl.parity_cases import (
    Items,
    Killer,
    Shards,
    Stuck,
    assert_same_outcomes,
    bad_collate,
    both,
    outcomes,
)

pytestmark = pytest.mark.timeout(120)


def compare(make, epochs: int = 1, **kwargs) -> list:
    ours, theirs = both(make, **kwargs)
    with ours:
        seen = outcomes(ours, epochs)
        assert_same_outcomes(seen, outcomes(theirs, epochs))
    return seen


def kinds(seen: list) -> list[str]:
    return [kind for kind, _ in seen[0]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_item_that_raises_costs_only_its_batch(num_workers: int) -> None:
    seen = compare(lambda: Items(40, bad=frozenset({7})), batch_size=4, num_workers=num_workers)
    assert kinds(seen) == ["batch"] + ["error"] + ["batch"] * 8  # 36 items, not 12
    assert "Caught KeyError" in str(seen[0][1][1]) or num_workers == 0


def test_every_item_raising_gives_one_error_per_batch() -> None:
    seen = compare(lambda: Items(41, bad=None), batch_size=2, num_workers=4)
    assert kinds(seen) == ["error"] * 21


@pytest.mark.parametrize("batch_ring", [True, False])
def test_errors_with_and_without_the_batch_ring(batch_ring: bool) -> None:
    ours, theirs = both(lambda: Items(30, bad=frozenset({0, 9, 10, 29})), batch_size=3, num_workers=2)
    ours.close()
    ours = coordl.DataLoader(
        Items(30, bad=frozenset({0, 9, 10, 29})), batch_size=3, num_workers=2, batch_ring=batch_ring
    )
    with ours:
        assert_same_outcomes(outcomes(ours, 2), outcomes(theirs, 2))


def test_persistent_workers_go_on_after_an_error() -> None:
    compare(
        lambda: Items(20, bad=frozenset({3})), batch_size=2, num_workers=2, persistent_workers=True, epochs=2
    )


def test_in_order_false_goes_on_after_an_error() -> None:
    ours, theirs = both(lambda: Items(24, bad=frozenset({5})), batch_size=2, num_workers=2, in_order=False)
    with ours:
        a, b = outcomes(ours), outcomes(theirs)
    assert sorted(kind for kind, _ in a[0]) == sorted(kind for kind, _ in b[0])
    assert sorted(repr(v) for k, v in a[0] if k == "batch") == sorted(
        repr(v) for k, v in b[0] if k == "batch"
    )


def test_collate_error_costs_only_its_batch() -> None:
    compare(Items, batch_size=4, num_workers=2, collate_fn=bad_collate)


def _broken_init(worker_id: int) -> None:
    if worker_id == 1:
        raise OSError("worker 1 could not open its file")


def test_worker_init_fn_error_is_reported_for_that_workers_batches() -> None:
    compare(Items, batch_size=5, num_workers=2, worker_init_fn=_broken_init)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_dataset_that_raises(num_workers: int) -> None:
    compare(lambda: Shards((4, 5), fail_at=2), batch_size=2, num_workers=num_workers)


def test_main_process_error_for_batch_size_none() -> None:
    compare(lambda: Items(6, bad=frozenset({2})), batch_size=None, num_workers=2)


# torch reports a dead worker from its SIGCHLD handler or from its queue's timeout, in one of two forms.
TORCH_DEATH = r"DataLoader worker \(pids?\(?s?\)? [\d, ]+\)( is killed by signal: | exited unexpectedly)"


def test_a_worker_that_dies_ends_the_epoch_in_torchs_words() -> None:
    # The worker dies at its first item, before it has sent anything. A worker killed after it sent a batch
    # can take torch's own loader down with ConnectionResetError instead: the main process still has to
    # fetch that batch's tensors' descriptors from the dead worker (seen once in CI on a slow host).
    ours, theirs = both(lambda: Killer(kill=0), batch_size=2, num_workers=2)
    with ours:
        with pytest.raises(RuntimeError, match=TORCH_DEATH):
            list(theirs)
        with pytest.raises(WorkerDiedError, match=TORCH_DEATH) as info:
            list(ours)
    assert "while preparing Killer[0]" in str(info.value)  # and coordl's detail: the item it was on


# -- timeout -----------------------------------------------------------------------------------------

# Measured on the shared 2-core dev VM with other jobs running (10 runs each, /tmp script in the issue 31
# report): torch's loader raised 1.002-1.012 s after next() for timeout=1, coordl's 1.001-1.009 s (6.0 s
# before, when an error stopped the workers first). The 0.1 s allowed is eight times the widest gap seen.
TIMEOUT_SLACK_S = 0.1


def test_timeout_fires_at_its_value_with_torchs_type_and_words() -> None:
    dl = coordl.DataLoader(Stuck(4, seconds=20), batch_size=1, num_workers=1, timeout=1)
    with dl:
        it = iter(dl)
        start = time.monotonic()
        with pytest.raises(RuntimeError) as info:
            next(it)
        elapsed = time.monotonic() - start
        del it
    assert isinstance(info.value, CoordlTimeoutError)
    assert "DataLoader timed out after 1 seconds" in str(info.value)
    assert 1.0 <= elapsed < 1.0 + TIMEOUT_SLACK_S, elapsed
